"""Why runs did not run, in short: a recorded reason without its detail, and the reasons of many
runs each said once, the GPU counts a plan needs said together (verdicts, pages, check and run)."""

from __future__ import annotations

import re

# backends/gpu_pool's reason for a point it cannot place; a count of more digits is no machine's
# (and beyond 4,300 digits Python refuses to read it as a number).
GPU_NEED = re.compile(r"needs (\d{1,6}) GPU\(s\)(.*)", re.S)


def short_reason(message: str) -> str:
    """A recorded reason without its parenthesised detail: "needs 1 GPU(s); this machine has no GPU"
    for "needs 1 GPU(s); this machine has no GPU (no NVIDIA driver found (no nvidia-smi))". Only
    groups that follow a space go (so "GPU(s)" stays); the full reason stays in the result file."""
    text, depth, out = message.splitlines()[0] if message else "", 0, []
    for i, ch in enumerate(text):
        if ch == "(" and (depth or (i > 0 and text[i - 1] == " ")):
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return re.sub(r"\s+([;,.])", r"\1", re.sub(r"\s{2,}", " ", "".join(out))).strip(" ;,")


def merged_reasons(messages: list[str]) -> list[str]:
    """Each short reason once (``short_reason``), in the order first met; GPU counts needed with the
    same rest said as one: "needs 1, 2 or 4 GPU(s); this machine has no GPU"."""
    counts: dict[str, set[int]] = {}  # a GPU need's rest -> the counts needed
    order: dict[tuple[bool, str], None] = {}  # (a GPU need, its rest or the reason), in order
    for message in dict.fromkeys(messages):  # thousands of runs hold a few messages
        reason = short_reason(message)
        need = GPU_NEED.fullmatch(reason)
        if need is None:
            order.setdefault((False, reason))
        else:
            counts.setdefault(need[2], set()).add(int(need[1]))
            order.setdefault((True, need[2]))
    out = []
    for is_need, text in order:
        if not is_need:
            out.append(text)
            continue
        found = sorted(counts[text])
        said = ", ".join(map(str, found[:-1])) + f" or {found[-1]}" if len(found) > 1 else str(found[0])
        out.append(f"needs {said} GPU(s){text}")
    return out
