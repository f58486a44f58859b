"""CLI: python -m tests.cluster build|align|images|up|down|status|logs|env|restart|prune|import-image.

`up` builds first when the binaries are missing, so `python -m tests.cluster up` is the one command
a developer needs: the control plane, the kwok nodes and the real node (`--no-real-node` leaves it
out). The processes outlive the CLI; `down` stops them by recorded PID.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from tests.cluster import node as node_mod
from tests.cluster.build import BuildError, build, build_node, build_optional, layout, stale_layouts
from tests.cluster.buildah import ImageError
from tests.cluster.cluster import ClusterError, LocalCluster
from tests.cluster.gomod_align import align, drift
from tests.cluster.images import build_all
from tests.cluster.processes import log_tail


def _cmd_build(args: argparse.Namespace) -> int:
    out = build(force=args.force)
    print(out.bin)
    if args.kueue:
        print(build_optional("kueue", force=args.force).bin)
    if args.real_node:
        print(build_node(force=args.force).bin)
    if args.s3:
        print(build_optional("seaweedfs", force=args.force).bin)
    return 0


def _cmd_align(args: argparse.Namespace) -> int:
    if args.check:
        out_of_line = drift()
        for name, wanted in out_of_line.items():
            print(f"{name}: " + ", ".join(f"{m} {v}" for m, v in sorted(wanted.items())))
        if out_of_line:
            print("run `python -m tests.cluster align` to write these replaces", file=sys.stderr)
        return 1 if out_of_line else 0
    for name, count in align().items():
        print(f"{name}: {count} replaces written, go.mod tidied")
    return 0


def _cmd_images(args: argparse.Namespace) -> int:
    built = build_all()
    if args.json:
        print(json.dumps([{"ref": b.ref, "archive": str(b.archive), "bytes": b.size} for b in built]))
    else:
        print("\n".join(f"{b.ref} {b.archive}" for b in built))
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    """The real node is started by default where this machine can run it; asked for with
    `--real-node`, what prevents it is an error, otherwise a warning and a cluster of kwok nodes."""
    missing = node_mod.missing_prerequisites() if args.real_node is not False else []
    if missing and args.real_node:
        print(f"the real node needs {missing}; or start without it: --no-real-node", file=sys.stderr)
        return 1
    cluster = LocalCluster.from_env()
    cluster.up(build())
    if args.kueue:
        cluster.start_kueue(build_optional("kueue"))
    if args.real_node is not False:
        if missing:
            print(f"no real node (it needs {missing}): kwok nodes only, no container runs", file=sys.stderr)
        else:
            try:
                cluster.start_real_node(build_node())
            except ClusterError as err:
                if args.real_node:
                    raise
                print(f"no real node: {err}; kwok nodes only (--real-node: an error)", file=sys.stderr)
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _cmd_import_image(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    if not cluster.real_node_running():
        print("no real node: `python -m tests.cluster up` starts one", file=sys.stderr)
        return 1
    for archive in args.archives:
        cluster.import_image(archive)
    return 0


def _cmd_kueue(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    if not cluster.is_live():
        print("no live control plane: `python -m tests.cluster up --kueue`", file=sys.stderr)
        return 1
    cluster.start_kueue(build_optional("kueue"))
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    if not cluster.paths.marker.exists():
        return 0
    with cluster.locked():
        cluster.down(purge=args.purge)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    rows = cluster.status()
    live = cluster.is_live()
    if args.json:
        print(
            json.dumps({"live": live, "state": str(cluster.paths.root), "processes": rows, **cluster.info()})
        )
        return 0 if live else 1
    print(f"state:      {cluster.paths.root}")
    print(f"binaries:   {layout().bin} ({'complete' if layout().complete() else 'not built'})")
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"live:       {live}")
    for r in rows:
        alive = "running" if r["alive"] else "DEAD"
        print(f"  {r['name']:<24} pid {r['pid']:<8} {alive:<8} {r['rss_mib']:>5} MiB")
    if rows:
        print(f"  total RSS {sum(r['rss_mib'] for r in rows)} MiB")
    return 0 if live else 1


def _cmd_logs(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    if not args.component:
        print(cluster.logs)
        return 0
    for rec in cluster.records():
        if rec.name == args.component:
            print(log_tail(rec.log, args.lines))
            return 0
    print(f"no component {args.component!r}; known: {[r.name for r in cluster.records()]}", file=sys.stderr)
    return 2


def _cmd_restart(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    rec = cluster.restart(args.component, down_for=args.down_for)
    print(rec.pid)
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    running = cluster.info().get("binaries")  # the live cluster's build, even after a re-pin
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={Path(running) / 'bin' if running else layout().bin}:$PATH")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    cluster = LocalCluster.from_env()
    in_use = cluster.info().get("binaries") if cluster.is_live() else None
    for d in stale_layouts(keep={Path(in_use)} if in_use else set()):
        print(f"removing {d}")
        if not args.dry_run:
            shutil.rmtree(d)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="build the binaries (no-op when cached); prints the bin folder")
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    p.add_argument("--kueue", action="store_true", help="also build Kueue (optional component)")
    p.add_argument("--real-node", action="store_true", help="also build the real node (optional)")
    p.add_argument(
        "--s3", action="store_true", help="also build SeaweedFS, the S3 server of the object-store tests"
    )
    p.set_defaults(fn=_cmd_build)
    p = sub.add_parser(
        "align",
        help="one version of each shared Go module across the wrappers (tests/cluster/gomod_align.py)",
    )
    p.add_argument("--check", action="store_true", help="list what is out of line; exit 1 if anything is")
    p.set_defaults(fn=_cmd_align)
    p = sub.add_parser(
        "images", help="build the operator and CPU trainer images (cached); prints `<ref> <archive>`"
    )
    p.add_argument("--json", action="store_true", help="a JSON list of {ref, archive, bytes}")
    p.set_defaults(fn=_cmd_images)
    p = sub.add_parser("up", help="build if needed, start everything, print the KUBECONFIG")
    p.add_argument("--kueue", action="store_true", help="also build (once) and start Kueue with a GPU queue")
    p.add_argument(
        "--real-node",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the real node (kubelet, containerd) beside the kwok nodes, built once; by default it "
        "starts where it can (root, runc, busybox-static; one per machine) and is left out with a "
        "warning where it cannot",
    )
    p.set_defaults(fn=_cmd_up)
    sub.add_parser("kueue", help="build (once) and start Kueue on the live control plane").set_defaults(
        fn=_cmd_kueue
    )
    p = sub.add_parser("import-image", help="import image archives (OCI or docker) into the real node")
    p.add_argument("archives", nargs="+", type=Path)
    p.set_defaults(fn=_cmd_import_image)
    p = sub.add_parser("down", help="stop the recorded processes (logs are kept)")
    p.add_argument("--purge", action="store_true", help="also delete the state folder")
    p.set_defaults(fn=_cmd_down)
    p = sub.add_parser("status", help="processes, memory, liveness (exit 1 when not live)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_status)
    p = sub.add_parser("logs", help="print the log folder, or the tail of one component's log")
    p.add_argument("component", nargs="?")
    p.add_argument("-n", "--lines", type=int, default=50)
    p.set_defaults(fn=_cmd_logs)
    p = sub.add_parser("restart", help="restart one component in place (fault tests; private clusters)")
    p.add_argument("component")
    p.add_argument("--down-for", type=float, default=0.0, help="seconds with the component stopped")
    p.set_defaults(fn=_cmd_restart)
    p = sub.add_parser("prune", help="delete cached builds of other pins (not the live cluster's)")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(fn=_cmd_prune)
    sub.add_parser("env", help="print shell exports for kubectl against the cluster").set_defaults(
        fn=_cmd_env
    )
    args = parser.parse_args(argv)
    try:
        rc: int = args.fn(args)
    except (BuildError, ClusterError, ImageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
