# `nix fmt`: nixfmt over the repository's .nix files. nixfmt alone reads standard input when it is given no
# file, and newer Nix runs the formatter with no argument (older ones pass "."): `nix fmt` would then wait on
# the terminal. Here no file operand means the tree; a directory operand means the .nix files under it.
{
  writeShellApplication,
  nixfmt,
  findutils,
  coreutils,
}:
writeShellApplication {
  name = "glm53-nixfmt";
  runtimeInputs = [
    nixfmt
    findutils
    coreutils
  ];
  text = ''
    files() {
      find "$1" -type f -name '*.nix' -not -path '*/.*' -not -path '*/result*' -print0 | sort -z
    }
    options=()
    operands=()
    for arg in "$@"; do
      case "$arg" in
        -*) options+=("$arg") ;;
        *) operands+=("$arg") ;;
      esac
    done
    if [ "''${#operands[@]}" -eq 0 ]; then
      operands=(.)
    fi
    paths=()
    for operand in "''${operands[@]}"; do
      if [ -d "$operand" ]; then
        while IFS= read -r -d "" file; do paths+=("$file"); done < <(files "$operand")
      else
        paths+=("$operand")
      fi
    done
    if [ "''${#paths[@]}" -eq 0 ]; then
      exit 0
    fi
    exec nixfmt "''${options[@]}" "''${paths[@]}"
  '';
}
