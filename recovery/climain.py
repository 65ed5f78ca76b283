"""How a command line of the toolkit ends: the one ``main`` loop of ``recover`` and of
``python -m agents`` (the node agent without the rest of ``recover``).

A :class:`RecoverError` becomes one paragraph on stderr and its own exit status; ``typer.Exit``
its code; Ctrl-C 130; a usage error (unknown option, missing value) typer's usage line and
message, and its status; a package of a part that is not installed (``recover train`` where
only the agent's extra is) names the extra that installs it, with status 2.
"""

from __future__ import annotations

import sys

import typer

from recovery.errors import RecoverError

#: The extra (pyproject.toml) that installs each package a part imports on demand.
EXTRA_OF = {
    "jax": "training", "jaxlib": "training", "numpy": "training", "xxhash": "training",
    "ml_dtypes": "training", "matplotlib": "report", "fastapi": "coordinator",
    "starlette": "coordinator", "uvicorn": "coordinator", "prometheus_client": "coordinator",
    "kubernetes": "coordinator", "pynvml": "agent", "grpc": "agent", "tpu_info": "agent",
    "orbax": "orbax", "flax": "examples", "optax": "examples",
}  # fmt: skip


def run(app: typer.Typer, argv: list[str] | None, *, prog: str) -> int:
    """Run ``app`` on ``argv`` (None: the process's arguments) and return the exit status;
    messages start with ``prog`` (``recover: error: ...``)."""
    try:
        # Without standalone mode, typer.Exit(n) comes back as the return value.
        rc = app(args=argv, standalone_mode=False)
    except RecoverError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:
        package = (e.name or "").split(".")[0]
        if package not in EXTRA_OF:
            raise
        extra = EXTRA_OF[package]
        print(
            f"{prog}: error: this command needs the Python package {package!r}, which is not "
            f"installed; the {extra!r} extra installs it: "
            f"pip install 'slurm-k8s-recover[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except typer.Exit as e:
        return int(e.exit_code)
    except typer.Abort:
        print(f"{prog}: aborted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # usage errors: unknown option, missing value, ...
        show = getattr(e, "show", None)
        if callable(show):
            show()
        else:
            print(f"{prog}: error: {e.format_message()}", file=sys.stderr)
        return int(e.exit_code)
    return rc if isinstance(rc, int) else 0
