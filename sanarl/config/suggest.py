""" "Did you mean ...?" for misspelled names: config keys, preset names, commands.

Names here are made of words (`optm_learning_rate`, `tiny-shapes-sft`): besides the spelling of the whole name
(difflib's ratio), a candidate scores by the share of words it shares with the typed name, where a word matches
the same word, a misspelling of it, a prefix of it (`optim` / `optimizer`) or the initials of several words
(`lr` for `learning rate`). So `optm_learning_rate` finds `optm_lr`, not `optm_decay_ratio`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

WORD_MATCH = 0.8
"""difflib ratio at which two words count as one misspelt for the other."""


def words(name: str) -> list[str]:
    """The lowercase words of a name (split at `_`, `-`, `.`, `/` and spaces)."""
    return [w for w in re.split(r"[_\-./\s]+", name.lower()) if w]


def _word_score(a: str, b: str) -> float:
    if a == b:
        return 1.0
    short, long = sorted((a, b), key=len)
    if len(short) >= 3 and long.startswith(short):
        return 0.9
    ratio = difflib.SequenceMatcher(None, a, b).ratio()
    return ratio if ratio >= WORD_MATCH else 0.0


def _initials(group: list[str]) -> str:
    return "".join(w[0] for w in group)


def _collapse(typed: list[str], other: list[str]) -> list[str]:
    """`typed` with each run of words whose initials are a word of `other` (`learning rate` -> `lr`) joined."""
    wanted = {w for w in other if len(w) >= 2}
    out, i = [], 0
    while i < len(typed):
        for j in range(len(typed), i + 1, -1):
            if _initials(typed[i:j]) in wanted:
                out.append(_initials(typed[i:j]))
                i = j
                break
        else:
            out.append(typed[i])
            i += 1
    return out


def _words_score(typed: str, candidate: str) -> float:
    a, b = words(typed), words(candidate)
    if not a or not b:
        return 0.0
    a, b = _collapse(a, b), _collapse(b, a)
    matched = 0.0
    left = list(b)
    for word in a:
        best = max(left, key=lambda w: _word_score(word, w), default=None)
        if best is not None and _word_score(word, best) > 0:
            matched += _word_score(word, best)
            left.remove(best)
    return matched / ((len(a) + len(b)) / 2)


def score(typed: str, candidate: str) -> float:
    """How alike `typed` and `candidate` are, in [0, 1]: the better of the whole-name and the word score."""
    whole = difflib.SequenceMatcher(None, typed.lower(), candidate.lower()).ratio()
    return max(whole, _words_score(typed, candidate))


def closest(typed: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate most like `typed` scoring at least `cutoff`, else None (ties: the first listed)."""
    best, best_score = None, cutoff
    for candidate in candidates:
        value = score(typed, candidate)
        if value > best_score or (best is None and value >= cutoff):
            best, best_score = candidate, value
    return best
