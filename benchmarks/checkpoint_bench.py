"""Checkpoint speed: raw numpy I/O, this project's store and Orbax, side by side on one state.

Run (see ``benchmarks/README.md`` for what each column means)::

    .venv/bin/python -m benchmarks.checkpoint_bench [--size-mib 1024] [--leaves 200]
        [--rounds 2] [--json out.json] [--dir DIR] [--drop-caches]

Every round measures, on the same JAX state and in this order: a raw fsync'd write and a raw
read of the same bytes (the limit), our sync save and restore + full verification, our async
save, then Orbax's sync save, restore and async save. Ratios are taken within a round (so a
noisy round moves both sides) and the median over rounds is reported. A discarded warm-up
round runs first: freshly allocated memory is slow on VMs, and the first save of a process
pays one-off costs (thread pools, imports) that a training run pays once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from recovery.checkpoint import tree
from recovery.checkpoint.asyncsave import AsyncCheckpointer
from recovery.checkpoint.store import CheckpointStore
from recovery.fsutil import fsync_dir

RUN_CONFIG = {"benchmark": "checkpoint_bench"}
MIB = 1024 * 1024
GB = 1e9  # throughput is reported in decimal GB/s, like disk vendors do


# --- the state -------------------------------------------------------------------------------


def make_state(total_bytes: int, leaves: int, seed: int) -> dict[str, Any]:
    """A nested dict of ``leaves`` float32 JAX arrays totalling about ``total_bytes``.

    A quarter are small vectors (biases, norms); the rest are 2-D and 3-D weights whose sizes
    follow a log-normal spread, as in real models where a few embeddings dominate.
    """
    rng = np.random.default_rng(seed)
    widths = rng.choice([128, 256, 512, 1024, 2048, 4096], size=leaves)
    n_vec = leaves // 4
    shapes: list[tuple[int, ...]] = [(int(w),) for w in widths[:n_vec]]
    budget = max(total_bytes // 4 - sum(s[0] for s in shapes), 1)
    weights = rng.lognormal(0.0, 1.0, leaves - n_vec)
    weights /= weights.sum()
    for j, (w, share) in enumerate(zip(widths[n_vec:], weights, strict=True)):
        rows = max(1, int(share * budget) // int(w))
        shapes.append((4, rows // 4, int(w)) if j % 5 == 0 and rows >= 8 else (rows, int(w)))
    order = rng.permutation(len(shapes))
    state: dict[str, Any] = {}
    for i, k in enumerate(order):
        host = rng.standard_normal(shapes[k], dtype=np.float32)
        block = state.setdefault("params", {}).setdefault(f"block_{i // 4:03d}", {})
        block[f"leaf_{i % 4}"] = jax.device_put(host)
    _ready(state)
    return state


def _ready(tree_: Any) -> Any:
    """``tree_`` once every array in it is computed (jax dispatches asynchronously)."""
    return jax.block_until_ready(tree_)  # type: ignore[no-untyped-call]


def state_bytes(state: Any) -> int:
    return sum(int(leaf.nbytes) for leaf in jax.tree_util.tree_leaves(state))


# --- raw numpy: the limit ----------------------------------------------------------------------


def raw_save(arrays: list[np.ndarray], directory: Path) -> None:
    """One file per leaf, each written with ``ndarray.tofile`` and fsynced, then the dir."""
    directory.mkdir()
    for i, a in enumerate(arrays):
        with open(directory / f"{i:05d}.bin", "wb") as f:
            a.tofile(f)
            f.flush()
            os.fsync(f.fileno())
    fsync_dir(directory)


def raw_read(arrays: list[np.ndarray], directory: Path) -> list[np.ndarray]:
    """``np.fromfile`` of every leaf file: no checks at all."""
    return [
        np.fromfile(directory / f"{i:05d}.bin", dtype=a.dtype).reshape(a.shape)
        for i, a in enumerate(arrays)
    ]


def raw_save_one_file(arrays: list[np.ndarray], directory: Path) -> None:
    """Every leaf appended to one file with ``ndarray.tofile``, one fsync, then the dir."""
    directory.mkdir()
    with open(directory / "all.bin", "wb") as f:
        for a in arrays:
            a.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)


def raw_read_one_file(arrays: list[np.ndarray], directory: Path) -> list[np.ndarray]:
    """``np.fromfile`` of each leaf in turn from the one file: no checks at all."""
    with open(directory / "all.bin", "rb") as f:
        return [np.fromfile(f, dtype=a.dtype, count=a.size).reshape(a.shape) for a in arrays]


# --- one round ---------------------------------------------------------------------------------


@dataclass
class Options:
    drop_caches: bool
    orbax: bool
    workers: int | None
    check: bool = False
    """Compare restored leaves with the state (untimed); done in the warm-up round."""


def _settle(*, before_read: bool, opts: Options) -> None:
    # Flush anything a previous step left dirty so it is not billed to the next one.
    os.sync()
    if before_read and opts.drop_caches:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _check_equal(state: Any, restored: Any, who: str) -> None:
    for a, b in zip(
        jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(restored), strict=True
    ):
        if not np.array_equal(np.asarray(a), np.asarray(b)):
            raise SystemExit(f"{who} restored different bytes: the benchmark is invalid")


def run_round(state: Any, root: Path, opts: Options) -> dict[str, float]:
    """Seconds for each operation of one round; every write goes to a fresh directory."""
    f: dict[str, float] = {}
    host = list(tree.to_host(state).values())

    _settle(before_read=False, opts=opts)
    f["raw_save"], _ = _timed(lambda: raw_save(host, root / "raw"))
    _settle(before_read=True, opts=opts)
    f["raw_read"], out = _timed(lambda: raw_read(host, root / "raw"))
    del out
    _settle(before_read=False, opts=opts)
    f["raw1_save"], _ = _timed(lambda: raw_save_one_file(host, root / "raw1"))
    _settle(before_read=True, opts=opts)
    f["raw1_read"], out = _timed(lambda: raw_read_one_file(host, root / "raw1"))
    del out
    # The limit is whichever raw layout the disk prefers this round.
    f["raw_limit_save"] = min(f["raw_save"], f["raw1_save"])
    f["raw_limit_read"] = min(f["raw_read"], f["raw1_read"])

    store = (
        CheckpointStore(root / "ours", workers=opts.workers)
        if opts.workers
        else CheckpointStore(root / "ours")
    )
    _settle(before_read=False, opts=opts)
    f["ours_save"], _ = _timed(lambda: store.save(1, tree.to_host(state), run_config=RUN_CONFIG))
    _settle(before_read=True, opts=opts)

    def ours_restore() -> Any:
        loaded = store.load(1, run_config=RUN_CONFIG)
        return _ready(tree.from_host(state, loaded.arrays))

    f["ours_restore"], restored = _timed(ours_restore)
    if opts.check:
        _check_equal(state, restored, "our store")
    del restored

    _settle(before_read=False, opts=opts)
    with AsyncCheckpointer(store) as saver:
        t0 = time.perf_counter()
        saver.save(2, tree.to_host(state), run_config=RUN_CONFIG)
        t1 = time.perf_counter()
        saver.wait()
        t2 = time.perf_counter()
    f["ours_async_blocked"], f["ours_async_durable"] = t1 - t0, t2 - t0

    if opts.orbax:
        f.update(_orbax_round(state, root / "orbax", opts))
    return f


def _orbax_round(state: Any, directory: Path, opts: Options) -> dict[str, float]:
    import orbax.checkpoint as ocp

    f: dict[str, float] = {}
    manager = ocp.CheckpointManager(directory.absolute())  # default options: async enabled
    try:
        _settle(before_read=False, opts=opts)

        def sync_save() -> None:
            manager.save(1, args=ocp.args.StandardSave(state))
            manager.wait_until_finished()

        f["orbax_save"], _ = _timed(sync_save)
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
        _settle(before_read=True, opts=opts)
        f["orbax_restore"], restored = _timed(
            lambda: _ready(manager.restore(1, args=ocp.args.StandardRestore(abstract)))
        )
        if opts.check:
            _check_equal(state, restored, "orbax")
        del restored

        _settle(before_read=False, opts=opts)
        t0 = time.perf_counter()
        manager.save(2, args=ocp.args.StandardSave(state))
        t1 = time.perf_counter()
        manager.wait_until_finished()
        t2 = time.perf_counter()
        f["orbax_async_blocked"], f["orbax_async_durable"] = t1 - t0, t2 - t0
    finally:
        manager.close()
    return f


# --- reporting -------------------------------------------------------------------------------

# (row label, implementation, key, raw key for the "x raw" column, whether GB/s makes sense)
# "x raw" compares with the faster of the two raw layouts of the same round (the limit).
ROWS: list[tuple[str, str, str, str | None, bool]] = [
    ("save, durable", "raw files", "raw_save", "raw_limit_save", True),
    ("save, durable", "raw 1file", "raw1_save", "raw_limit_save", True),
    ("save, durable", "ours", "ours_save", "raw_limit_save", True),
    ("save, durable", "orbax", "orbax_save", "raw_limit_save", True),
    ("restore", "raw files", "raw_read", "raw_limit_read", True),
    ("restore", "raw 1file", "raw1_read", "raw_limit_read", True),
    ("restore+verify", "ours", "ours_restore", "raw_limit_read", True),
    ("restore", "orbax", "orbax_restore", "raw_limit_read", True),
    ("async: blocked", "ours", "ours_async_blocked", None, False),
    ("async: blocked", "orbax", "orbax_async_blocked", None, False),
    ("async: durable", "ours", "ours_async_durable", "raw_limit_save", True),
    ("async: durable", "orbax", "orbax_async_durable", "raw_limit_save", True),
]


@dataclass
class SizeResult:
    label: str
    nbytes: int
    leaves: int
    rounds: list[dict[str, float]] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        vals = [r[key] for r in self.rounds if key in r]
        return statistics.median(vals) if vals else None

    def ratio(self, key: str, ref: str) -> float | None:
        vals = [r[key] / r[ref] for r in self.rounds if key in r and ref in r and r[ref] > 0]
        return statistics.median(vals) if vals else None

    def to_json(self) -> dict[str, Any]:
        keys = sorted({k for r in self.rounds for k in r})
        ratios: dict[str, float | None] = {}
        for _, impl, key, raw_key, _ in ROWS:
            if raw_key is not None and key != raw_key:
                ratios[f"{key}/{raw_key}"] = self.ratio(key, raw_key)
            orbax_key = key.replace("ours_", "orbax_")
            if impl == "ours":
                ratios[f"{key}/{orbax_key}"] = self.ratio(key, orbax_key)
        return {
            "label": self.label,
            "bytes": self.nbytes,
            "leaves": self.leaves,
            "rounds": self.rounds,
            "median_seconds": {k: self.median(k) for k in keys},
            "median_ratios": ratios,
        }


def _fmt(x: float | None, spec: str) -> str:
    """``x`` formatted with ``spec``, or a dash as wide as the spec's width."""
    if x is None:
        width = spec.split(".")[0]
        return format("-", f">{width}") if width else "-"
    return format(x, spec)


def table(res: SizeResult) -> str:
    head = f"{'operation':<16} {'impl':<9} {'seconds':>8} {'GB/s':>7} {'x raw':>7} {'x orbax':>8}"
    lines = [head, "-" * len(head)]
    for op, impl, key, raw_key, rate in ROWS:
        sec = res.median(key)
        if sec is None:
            continue
        gbs = res.nbytes / sec / GB if rate and sec > 0 else None
        x_raw = res.ratio(key, raw_key) if raw_key else None
        x_orbax = res.ratio(key, key.replace("ours_", "orbax_")) if impl == "ours" else None
        lines.append(
            f"{op:<16} {impl:<9} {sec:>8.3f} {_fmt(gbs, '7.2f')} "
            f"{_fmt(x_raw, '7.2f')} {_fmt(x_orbax, '8.2f')}"
        )
    return "\n".join(lines)


def targets(big: SizeResult, small: SizeResult | None) -> list[tuple[str, float | None, bool]]:
    """The issue's targets as ``(description with value, value, met)``."""
    out: list[tuple[str, float | None, bool]] = []

    def add(desc: str, value: float | None, limit: float, unit: str) -> None:
        ok = value is not None and value <= limit
        out.append((f"{desc} <= {limit:g}{unit}: {_fmt(value, '.3g')}{unit}", value, ok))

    add(f"{big.label} save / raw save", big.ratio("ours_save", "raw_limit_save"), 1.2, "x")
    add(
        f"{big.label} restore+verify / raw read",
        big.ratio("ours_restore", "raw_limit_read"),
        1.5,
        "x",
    )
    if small is not None:
        add(f"{small.label} save", small.median("ours_save"), 0.03, " s")
    for r in (big, small):
        if r is not None and r.median("orbax_async_blocked") is not None:
            add(
                f"{r.label} async blocked / orbax's",
                r.ratio("ours_async_blocked", "orbax_async_blocked"),
                1.0,
                "x",
            )
    return out


# --- driver ----------------------------------------------------------------------------------


def measure(
    label: str, size_mib: float, leaves: int, rounds: int, warmup: int, base: Path, args: Any
) -> SizeResult:
    state = make_state(int(size_mib * MIB), leaves, args.seed)
    res = SizeResult(label, state_bytes(state), leaves)
    opts = Options(drop_caches=args.drop_caches, orbax=not args.skip_orbax, workers=args.workers)
    for i in range(warmup + rounds):
        opts.check = i == 0
        root = base / f"{label.replace(' ', '')}-round{i}"
        root.mkdir()
        try:
            figures = run_round(state, root, opts)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            os.sync()
        kind = "warm-up, discarded" if i < warmup else "measured"
        print(
            f"  {label} round {i} ({kind}): "
            + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()),
            file=sys.stderr,
        )
        if i >= warmup:
            res.rounds.append(figures)
    return res


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.checkpoint_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size-mib", type=float, default=1024, help="large state size (MiB)")
    p.add_argument("--leaves", type=int, default=200, help="leaves of the large state")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds, large state")
    p.add_argument(
        "--small-mib",
        type=float,
        default=10,
        help="small state size in MiB, for fixed overhead (0 skips it)",
    )
    p.add_argument(
        "--small-leaves",
        type=int,
        default=None,
        help="leaves of the small state (default: --leaves)",
    )
    p.add_argument("--small-rounds", type=int, default=7, help="measured rounds, small state")
    p.add_argument("--warmup", type=int, default=1, help="discarded warm-up rounds per size")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="CheckpointStore workers (default: the store's default)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to write (default: $TMPDIR); must be on the disk to measure",
    )
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="sync and drop the page cache before each read (needs root)",
    )
    p.add_argument("--skip-orbax", action="store_true", help="leave Orbax out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = p.parse_args(argv)
    if args.drop_caches and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        p.error("--drop-caches needs write access to /proc/sys/vm/drop_caches (run as root)")
    return args


def _quiet_orbax() -> None:
    logging.getLogger("absl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="orbax")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _quiet_orbax()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    reads = "from disk (page cache dropped)" if args.drop_caches else "from the page cache"
    results: list[SizeResult] = []
    t_start = time.perf_counter()
    try:
        big_label = f"{args.size_mib:g} MiB"
        results.append(
            measure(big_label, args.size_mib, args.leaves, args.rounds, args.warmup, base, args)
        )
        if args.small_mib > 0:
            small_leaves = args.small_leaves or args.leaves
            results.append(
                measure(
                    f"{args.small_mib:g} MiB",
                    args.small_mib,
                    small_leaves,
                    args.small_rounds,
                    args.warmup,
                    base,
                    args,
                )
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    big, small = results[0], (results[1] if len(results) > 1 else None)

    cpus = os.cpu_count()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(
        f"\ncheckpoint benchmark - {cpus} CPUs, {mem_gib:.0f} GiB RAM, jax {jax.__version__}"
        f", reads {reads}, dir {base.parent}"
    )
    for r in results:
        print(
            f"\n{r.label} state: {r.nbytes / MIB:.1f} MiB in {r.leaves} float32 leaves, "
            f"median of {len(r.rounds)} rounds"
        )
        print(table(r))
    checks = targets(big, small)
    print("\ntargets:")
    for desc, _, ok in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {desc}")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")

    if args.json is not None:
        doc = {
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": cpus, "mem_gib": round(mem_gib, 1)},
            "versions": _versions(),
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "reads": reads,
            "sizes": [r.to_json() for r in results],
            "targets": [{"target": d, "value": v, "met": ok} for d, v, ok in checks],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "numpy": np.__version__, "jax": jax.__version__}
    try:
        import orbax.checkpoint as ocp

        out["orbax-checkpoint"] = ocp.__version__
    except ImportError:
        pass
    return out


if __name__ == "__main__":
    raise SystemExit(main())
