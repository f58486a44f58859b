"""Entry point of the `asyncgrpo` console script.

Each subcommand lives with the package it belongs to and is imported only when it runs: `validate`
must stay light (no torch, no ray, no Kubernetes client), `render` needs the operator's manifests,
and `run` needs the trainer.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("asyncgrpo_api.validate_cli", "check job files against the admission rules, offline"),
    "crd": ("asyncgrpo_api.crdgen", "write (or --check) the generated CustomResourceDefinition"),
    "render": ("asyncgrpo_operator.render", "print the objects the operator would create for a job"),
    "logs": (
        "asyncgrpo_operator.driverlog",
        "stream a job's driver log (-f to follow), or say where its log files are once the pod is gone",
    ),
    "run": ("asyncgrpo_trainer.local_run", "run a job on this machine with an embedded Ray (no Kubernetes)"),
    "export": (
        "asyncgrpo_trainer.export",
        "write a Hugging Face checkpoint directory from a training checkpoint",
    ),
    "make-tiny-checkpoint": (
        "asyncgrpo_trainer.models.tiny_checkpoint",
        "write a small random Hugging Face checkpoint (tests, CPU examples)",
    ),
    "plot": (
        "asyncgrpo_trainer.plot",
        "draw accuracy and reward against trained samples for runs (a PNG, from their TensorBoard files)",
    ),
}

USAGE = (
    "usage: asyncgrpo {"
    + ",".join(SUBCOMMANDS)
    + "} ...\n\n"
    + "\n".join(f"  {name:<21} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items())
)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand's own main(argv)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(USAGE)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"asyncgrpo: unknown command {name!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = "trainer" if SUBCOMMANDS[name][0].startswith("asyncgrpo_trainer") else "operator"
        print(
            f"asyncgrpo {name}: needs the '{extra}' extra ({exc.name} is missing); "
            f"install it with: pip install 'asyncgrpo[{extra}]'",
            file=sys.stderr,
        )
        return 2
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
