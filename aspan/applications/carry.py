"""What a GPU slice carries to the lent machine (`aspan gpu carry`, `make gpu-carry`), and whether it fits.

A lent machine gets a copy of the working tree with every command: the tracked files and the untracked ones git
does not ignore, plus the paths a command names to carry (here the wheels of `configs/gpu/wheels.toml`), at most
`TRAVEL_LIMIT` in all. The campaign's state (`results/gpu_campaign/state`) is tracked, so it travels with the code,
and everything a run reads next (a paused training's checkpoint, a base another run fine-tunes) must be in it. This
module sizes all of that, by part and by run, and checks the rule the campaign keeps: code, campaign state and
wheels together at most `CARRY_BUDGET` (8 MiB under the limit, for the state a slice adds before the next check),
and every input of the next run inside what travels.
"""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io import read_toml
from .campaign import entry_state

MIB = 2**20
TRAVEL_LIMIT = 64 * MIB  # what a lent machine takes with one command
CARRY_BUDGET = 60 * MIB  # what the campaign keeps code + state + wheels under (4 MiB short of the limit)
WHEELS = "configs/gpu/wheels.toml"
WHEEL_DIR = ".gpu-wheels"
CHECKPOINT_PARTS = ("checkpoints",)  # a directory of these names under a run holds a paused training's state


@dataclass
class Carry:
    """The sizes of what travels, and what is wrong with it."""

    tree: dict[str, int]  # every file that travels with the working tree (tracked, untracked not ignored): bytes
    wheels: dict[str, int]  # the carried wheels: bytes
    campaign: str  # the campaign directory, relative to the root
    problems: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Bytes of the tree and the wheels together: what travels with a command."""
        return sum(self.tree.values()) + sum(self.wheels.values())

    def under(self, prefix: str) -> int:
        """Bytes of the tree's files under directory `prefix`."""
        prefix = prefix.rstrip("/") + "/"
        return sum(n for p, n in self.tree.items() if p.startswith(prefix))


def tree_files(root: Path) -> dict[str, int]:
    """Every file of the working tree at `root` that travels, by relative path: git's tracked files that exist and
    the untracked ones it does not ignore (ValueError when `root` is not a git checkout)."""
    try:
        got = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise ValueError(f"{root} is not a git checkout (git ls-files failed: {e})") from None
    out = {}
    for name in sorted(set(got.stdout.decode().split("\0")) - {""}):
        p = root / name
        if p.is_file() and not p.is_symlink():
            out[name] = p.stat().st_size
    return out


def wheel_sizes(root: Path, problems: list[str]) -> dict[str, int]:
    """The carried wheels' bytes: the files of `.gpu-wheels/` where it exists (each checked against the manifest's
    digest), else the manifest's sizes."""
    manifest = {w["file"]: w for w in read_toml(root / WHEELS).get("wheel", [])}
    folder = root / WHEEL_DIR
    if not folder.is_dir():
        return {name: int(w["bytes"]) for name, w in manifest.items()}
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name not in manifest:
            problems.append(f"{WHEEL_DIR}/{p.name} is not in {WHEELS}: it would travel unchecked")
        elif hashlib.sha256(p.read_bytes()).hexdigest() != manifest[p.name]["sha256"]:
            problems.append(f"{WHEEL_DIR}/{p.name} does not match its sha256 in {WHEELS}")
        out[p.name] = p.stat().st_size
    for name in sorted(set(manifest) - set(out)):
        problems.append(f"{WHEEL_DIR}/{name} is missing (make gpu-wheels)")
    return out


def carry(root: Path, campaign: str = "results/gpu_campaign/state", plan=None) -> Carry:
    """Size what travels from the checkout at `root`, and check it: the whole under `CARRY_BUDGET`, and (with the
    campaign `plan`) every input of the next unfinished run inside the tree that travels (`next_inputs`)."""
    problems: list[str] = []
    got = Carry(tree_files(root), wheel_sizes(root, problems), campaign.rstrip("/"), problems)
    if got.total > CARRY_BUDGET:
        problems.append(f"code, campaign state and wheels take {got.total / MIB:.1f} MiB, over the campaign's "
                        f"{CARRY_BUDGET / MIB:.0f} MiB ({TRAVEL_LIMIT / MIB:.0f} MiB travel with a command)")
    if plan is not None:
        fixed = got.total - got.under(got.campaign)
        if fixed + plan.state_mib * MIB > CARRY_BUDGET:
            problems.append(f"code and wheels ({fixed / MIB:.1f} MiB) plus the state a slice may leave (state_mib "
                            f"{plan.state_mib:g} MiB) exceed {CARRY_BUDGET / MIB:.0f} MiB: lower state_mib or carry "
                            "less")
        problems += [p for inputs in next_inputs(root, got, plan).values() for p in inputs["problems"]]
    return got


def next_inputs(root: Path, got: Carry, plan) -> dict[str, dict[str, Any]]:
    """For the next unfinished run of `plan`: the files it reads (its `--config` files, the repository paths those
    name, its state directory) with their bytes, and what keeps them from travelling (a file git ignores, a path
    outside the checkout, a package no carried wheel provides)."""
    campaign = root / got.campaign
    provides = {m for w in read_toml(root / WHEELS).get("wheel", []) for m in w.get("provides", [])}
    for entry in plan.entries():
        if entry_state(campaign, entry)["state"] == "done":
            continue
        problems, files = [], {}
        for path in _named_paths(root, entry.command):
            rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else None
            found = {p: n for p, n in got.tree.items() if rel is not None and (p == rel or p.startswith(rel + "/"))}
            if not found:
                problems.append(f"{entry.name}: {path} does not travel (outside the checkout, or ignored by git)")
            files.update(found)
        state = f"{got.campaign}/{entry.name}"
        files.update({p: n for p, n in got.tree.items() if p.startswith(state + "/")})
        ignored = _ignored(root, campaign / entry.name)
        problems += [f"{entry.name}: {p} is ignored by git, so the next slice would not get it" for p in ignored]
        problems += [f"{entry.name}: needs {m}, which no carried wheel provides (configs/gpu/wheels.toml)"
                     for m in entry.requires if m.split(".")[0] not in provides]
        return {entry.name: {"bytes": sum(files.values()), "files": len(files), "problems": problems}}
    return {}


def _named_paths(root: Path, command: tuple[str, ...]) -> list[Path]:
    """The `--config` files of a command line, and the existing repository paths their string values name."""
    out = []
    for flag, value in zip(command, command[1:]):
        if flag != "--config":
            continue
        config = (root / value).resolve()
        out.append(config)
        if config.is_file():
            for text in _strings(read_toml(config)):
                if "/" in text and (root / text).exists():
                    out.append((root / text).resolve())
    return out


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _ignored(root: Path, directory: Path) -> list[str]:
    """The files under `directory` that git ignores (they would not travel)."""
    if not directory.is_dir():
        return []
    try:
        got = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                              "--", str(directory)], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(name for name in got.stdout.decode().split("\0") if name and not Path(name).name.startswith(".aspan"))


def state_parts(got: Carry) -> dict[str, dict[str, int]]:
    """Per run of the campaign state: its bytes in rows (JSONL, CSV, JSON), models and checkpoints of paused
    trainings, and everything else."""
    out: dict[str, dict[str, int]] = {}
    prefix = got.campaign + "/"
    for p, n in got.tree.items():
        if not p.startswith(prefix):
            continue
        run, _, rest = p[len(prefix):].partition("/")
        parts = rest.split("/")
        kind = ("paused checkpoints" if any(c in parts for c in CHECKPOINT_PARTS)
                else "figures" if parts[0] in ("figures", "images")
                else "models" if p.endswith((".safetensors", ".pt", ".gguf"))
                else "rows" if p.endswith((".jsonl", ".csv", ".json")) else "other")
        out.setdefault(run, {}).setdefault(kind, 0)
        out[run][kind] += n
    return out


def format_carry(got: Carry, plan=None, root: Path | None = None) -> str:
    """What a slice carries, as text: the tree by part, the campaign state by run, the wheels, the total against the
    campaign's budget and the machine's limit, the next run's inputs, then every problem."""
    def mib(n: int) -> str:
        return f"{n / MIB:7.2f} MiB"

    state = got.under(got.campaign)
    lines = [f"what a slice carries to the GPU machine ({TRAVEL_LIMIT / MIB:.0f} MiB travel with each command; "
             f"the campaign keeps it under {CARRY_BUDGET / MIB:.0f} MiB):",
             f"  code, docs and other results {mib(sum(got.tree.values()) - state)}  "
             f"({len(got.tree)} files in the tree)",
             f"  campaign state               {mib(state)}  ({got.campaign})"]
    for run, parts in sorted(state_parts(got).items()):
        detail = ", ".join(f"{k} {v / MIB:.2f}" for k, v in sorted(parts.items()))
        lines.append(f"    {run:26s} {mib(sum(parts.values()))}  ({detail})")
    if plan is not None:
        lines.append(f"  a slice leaves at most       {plan.state_mib:7.2f} MiB of state (state_mib: paused "
                     "trainings over it are dropped)")
    lines += [f"  wheels ({WHEEL_DIR}, carried) {mib(sum(got.wheels.values()))}  ({len(got.wheels)} files)",
              f"  total                        {mib(got.total)}  of {CARRY_BUDGET / MIB:.0f} MiB "
              f"({100 * got.total / CARRY_BUDGET:.0f} %)"]
    if plan is not None and root is not None:
        for name, inputs in next_inputs(root, got, plan).items():
            lines.append(f"next run: {name}, its state and config files {mib(inputs['bytes'])} "
                         f"({inputs['files']} files)")
    lines += [f"problem: {p}" for p in got.problems]
    lines.append("carry: ok" if not got.problems else f"carry: {len(got.problems)} problem(s)")
    return "\n".join(lines)
