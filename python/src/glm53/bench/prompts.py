"""Prompts of an exact token length, and long haystacks, without tokenizing long texts.

A short base text is tokenized once by the server (`/tokenize`); long prompts are made by tiling and cutting
those token ids, so a 260K-token prompt costs one list copy, not a 260K-token tokenization (and never one
tokenization per length tried).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal, Protocol

from glm53.errors import BadInput, CheckFailed

PromptStyle = Literal["prose", "random"]
PROMPT_STYLES: tuple[PromptStyle, ...] = ("prose", "random")


def parse_style(text: str, *, flag: str = "--style") -> PromptStyle:
    for style in PROMPT_STYLES:
        if text == style:
            return style
    raise BadInput(f"{flag} {text!r} is not one of {', '.join(PROMPT_STYLES)}")


# Plain, varied filler written for this tool: long enough to tile without short-period repetition.
BASE_PARAGRAPHS: tuple[str, ...] = (
    "The harbour office opens at six, when the first ferries leave for the outer islands. Clerks sort "
    "the manifests by destination, weigh the mail sacks and note every crate of citrus that arrives from "
    "the south.",
    "In the old quarter the streets narrow to stairways. Bakers carry trays of bread up and down them before "
    "dawn, and the smell of rye and caraway drifts through the open shutters of the apartments above.",
    "A survey team spent the spring mapping the river delta. They counted forty-one channels, measured the "
    "depth of each at low tide and marked where the sandbanks had moved since the previous decade.",
    "The library keeps its rarest atlases in a cool room under the reading hall. Visitors sign a ledger, "
    "wear cotton gloves and may turn the pages only with a flat wooden spatula.",
    "Every autumn the orchard cooperative presses its apples in a shared barn. Families bring their own "
    "barrels, and the cider is labelled with the name of the hillside where the fruit was picked.",
    "The observatory on the ridge records the temperature, pressure and wind every ten minutes. Its logbooks "
    "go back ninety years, written first in ink, then on punched cards and now in plain text files.",
    "At the railway workshop apprentices learn to true a wheel, to read a pressure gauge and to fit a brake "
    "shoe. Their teacher insists that every measurement be written down before any part is changed.",
    "The market square fills on Thursdays. Cheese makers from the valley set up beside fishmongers from the "
    "coast, and a string quartet plays near the fountain until the stalls are packed away at noon.",
)


class Tokenizer(Protocol):
    def tokenize(self, model: str, text: str) -> list[int]: ...


@dataclass
class PromptFactory:
    """Builds token-id prompts of exact length for one served model; each base text is tokenized once."""

    tokenizer: Tokenizer
    model: str
    _base_ids: list[int] | None = field(default=None, init=False, repr=False)
    _paragraph_ids: list[list[int]] | None = field(default=None, init=False, repr=False)

    def base_ids(self) -> list[int]:
        if self._base_ids is None:
            ids = self.tokenizer.tokenize(self.model, "\n\n".join(BASE_PARAGRAPHS) + "\n\n")
            if len(ids) < 16:
                raise CheckFailed(f"/tokenize returned only {len(ids)} tokens for the base text")
            self._base_ids = ids
        return self._base_ids

    def exact(self, length: int, style: PromptStyle = "prose", *, seed: int = 0) -> list[int]:
        """A prompt of exactly `length` token ids."""
        if length <= 0:
            return []
        base = self.base_ids()
        if style == "random":
            # Ids drawn from those the base text uses: real tokens, never special ones.
            vocabulary = sorted(set(base))
            return random.Random(seed).choices(vocabulary, k=length)
        tiled = base * -(-length // len(base))
        del tiled[length:]  # truncate in place: one allocation, no second copy of a 260K-item list
        return tiled

    def paragraph_token_counts(self) -> list[int]:
        """Tokens of each base paragraph followed by its blank line, tokenized once each."""
        if self._paragraph_ids is None:
            self._paragraph_ids = [self.tokenizer.tokenize(self.model, p + "\n\n") for p in BASE_PARAGRAPHS]
        return [len(ids) for ids in self._paragraph_ids]

    def haystack(self, budget_tokens: int, *, insert: str, depth: float) -> tuple[str, int]:
        """Text of about `budget_tokens` tokens (never more, as counted per paragraph) with `insert` placed
        as its own paragraph at `depth` (0..1) of the text. Returns the text and the estimated token count."""
        counts = self.paragraph_token_counts()
        insert_tokens = len(self.tokenizer.tokenize(self.model, insert + "\n\n"))
        chosen: list[int] = []
        used = insert_tokens
        index = 0
        while used + counts[index % len(counts)] <= budget_tokens:
            used += counts[index % len(counts)]
            chosen.append(index % len(counts))
            index += 1
        position = min(len(chosen), max(0, round(depth * len(chosen))))
        parts = [BASE_PARAGRAPHS[i] for i in chosen]
        parts.insert(position, insert)
        return "\n\n".join(parts) + "\n\n", used
