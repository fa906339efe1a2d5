"""The `glm53` command line: thin commands over the library, one module per noun."""
