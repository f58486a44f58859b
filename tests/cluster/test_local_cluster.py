"""Fast checks of the launcher's parts that need no control plane (run in every test job)."""

from __future__ import annotations

import json
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from tests.cluster import hostnet, kueue, oci, pki
from tests.cluster.build import (
    NODE_COMPONENTS,
    Progress,
    build_hash,
    check_pins,
    helm_ldflags,
    k8s_ldflags,
    node_layout,
    optional_layout,
)
from tests.cluster.cluster import STAGES_FILE
from tests.cluster.config import components, kubernetes_version
from tests.cluster.fixtures import log_sizes, logged_during
from tests.cluster.images import estimate, images
from tests.cluster.processes import PidFile, ProcRecord, is_alive, port_in_use, spawn, stop


def test_versions_toml_matches_every_gomod() -> None:
    check_pins()
    default = {"kubernetes", "etcd", "kwok", "kuberay", "helm"}
    optional = {"kueue", "seaweedfs", *NODE_COMPONENTS}
    assert set(components()) == default | optional
    assert {c.name for c in components().values() if c.optional} == optional
    assert kubernetes_version().startswith("v1.")


def test_the_real_nodes_kubelet_is_the_control_planes_version_and_cached_apart() -> None:
    assert components()["kubelet"].version == kubernetes_version()
    assert components()["kubelet"].module == components()["kubernetes"].module
    assert node_layout().root.name.startswith("node-")
    assert build_hash() not in node_layout().root.name


def test_an_oci_archive_names_its_image_and_holds_the_files_and_links(tmp_path: Path) -> None:
    exe = tmp_path / "tool"
    exe.write_bytes(b"#!/bin/sh\n")
    exe.chmod(0o755)
    out = tmp_path / "image.tar"
    files, links = {"bin/tool": exe}, {"bin/t": "tool"}
    oci.write_image(out, "localhost/x/tool:1", files, entrypoint=["/bin/tool"], links=links)
    with tarfile.open(out) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (manifest_desc,) = index["manifests"]
        assert manifest_desc["annotations"]["io.containerd.image.name"] == "localhost/x/tool:1"
        blob = f"blobs/sha256/{manifest_desc['digest'].split(':')[1]}"
        manifest = json.load(tar.extractfile(blob))  # type: ignore[arg-type]
        layer = tar.extractfile(f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}")
        with tarfile.open(fileobj=layer) as fs:
            assert fs.getmember("bin/tool").mode == 0o755
            assert fs.getmember("bin/t").linkname == "tool"


def test_kueue_is_cached_apart_so_pinning_it_never_rebuilds_the_demos_components() -> None:
    assert build_hash() not in optional_layout("kueue").root.name
    assert optional_layout("kueue").root.name.startswith("kueue-")


def test_kueue_webhooks_point_at_localhost_and_skip_integrations_that_are_off(tmp_path: Path) -> None:
    manifest = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            {
                "name": f"m{res}.kb.io",
                "clientConfig": {"service": {"name": "webhook-service", "path": f"/mutate-{res}"}},
                "rules": [{"apiGroups": [group], "resources": [res]}],
            }
            for group, res in (
                ("ray.io", "rayclusters"),
                ("ray.io", "rayjobs"),
                ("", "pods"),
                ("kueue.x-k8s.io", "workloads"),
            )
        ],
    }
    (out,) = kueue.webhook_configurations([manifest], b"CA")
    assert out["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert [h["name"] for h in out["webhooks"]] == ["mrayclusters.kb.io", "mworkloads.kb.io"]
    port = kueue.config(tmp_path)["webhook"]["port"]
    assert out["webhooks"][0]["clientConfig"]["url"] == f"https://127.0.0.1:{port}/mutate-rayclusters"
    assert out["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="


def test_the_default_cluster_queue_holds_the_whole_gpu_pool() -> None:
    (group,) = kueue.cluster_queue()["spec"]["resourceGroups"]
    quota = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quota["nvidia.com/gpu"] == "32"
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]


def test_k8s_ldflags_stamp_both_version_packages() -> None:
    flags = k8s_ldflags("v1.36.3")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X '{pkg}.gitVersion=v1.36.3'" in flags
        assert f"-X '{pkg}.gitMinor=36'" in flags


def test_helm_ldflags_stamp_version_and_default_kube_version() -> None:
    flags = helm_ldflags("v3.22.0")
    assert "helm.sh/helm/v3/internal/version.version=v3.22.0" in flags
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1" in flags
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=" in flags


def test_kwok_stages_cover_lifecycle_and_faults() -> None:
    stages = list(yaml.safe_load_all(STAGES_FILE.read_text()))
    names = [s["metadata"]["name"] for s in stages]
    assert len(names) == len(set(names))
    assert {
        "node-initialize",
        "pod-ready",
        "pod-complete",
        "pod-delete",
        "pod-fail",
        "node-not-ready",
    } <= set(names)
    assert all(s["kind"] == "Stage" for s in stages)


def test_pki_certificates_fit_their_use(tmp_path: Path) -> None:
    p = pki.create(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(p.ca_crt.read_bytes())
    serving = x509.load_pem_x509_certificate(p.server_crt.read_bytes())
    admin = x509.load_pem_x509_certificate(p.admin_crt.read_bytes())
    serving.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    orgs = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    assert oct(p.ca_key.stat().st_mode & 0o777) == "0o600"
    proxy_ca = x509.load_pem_x509_certificate(p.front_proxy_ca_crt.read_bytes())
    proxy_client = x509.load_pem_x509_certificate(p.front_proxy_client_crt.read_bytes())
    proxy_client.verify_directly_issued_by(proxy_ca)  # a CA of its own: the cluster CA's clients
    assert proxy_ca.subject != ca.subject  # must not be able to pose as the front proxy
    assert proxy_client.subject.rfc4514_string() == f"CN={pki.FRONT_PROXY_CLIENT}"


def test_stop_signals_only_a_recorded_live_process(tmp_path: Path) -> None:
    pids = PidFile(tmp_path / "pids.json")
    rec = spawn(
        "sleeper", ["sleep", "60"], logs=tmp_path, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, pids=pids
    )
    assert pids.load() == [rec]
    assert is_alive(rec)
    # Same pid, different start time: what a recycled pid looks like. It must be left alone.
    impostor = ProcRecord(rec.name, rec.pid, rec.start_ticks + 1, rec.log, rec.argv)
    assert not is_alive(impostor)
    assert not stop(impostor)
    assert is_alive(rec)
    assert stop(rec)
    assert not is_alive(rec)


def test_port_in_use_detects_a_listener() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use("127.0.0.1", s.getsockname()[1])


def test_ci_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(Path(__file__).with_name("ci.sh"))], check=True)


def test_build_progress_says_what_is_left_for_the_part_and_the_whole() -> None:
    progress = Progress(["kubernetes", "etcd", "kwok"], {"kubernetes": 600.0, "etcd": 40.0, "kwok": 250.0})
    assert progress.left_after("kubernetes", 100.0) == (500.0, 790.0)
    assert progress.left_after("kubernetes", 900.0) == (0.0, 290.0)  # past its estimate: the rest
    assert progress.left_after("kwok", 50.0) == (200.0, 200.0)
    assert progress.started("kubernetes") == "[1 of 3; 10.0 min last time, 14.8 min left in all]"


def test_one_real_node_per_machine_a_live_holder_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostnet, "OWNER_FILE", tmp_path / "owner")
    a, b = tmp_path / "a", tmp_path / "b"
    hostnet.claim(a, holds=lambda _: True)
    hostnet.claim(a, holds=lambda _: True)  # again: its own
    with pytest.raises(RuntimeError, match="one per machine"):
        hostnet.claim(b, holds=lambda other: other == a)
    assert hostnet.owned_by(a) and not hostnet.owned_by(b)
    hostnet.claim(b, holds=lambda _: False)  # a's kubelet is gone: b takes over
    hostnet.release(a)  # not a's any more: kept
    assert hostnet.owned_by(b)
    hostnet.release(b)
    assert hostnet.owned_by(a)


def test_build_progress_without_a_measured_time_says_only_what_it_knows() -> None:
    progress = Progress(["kubernetes", "etcd"], {"kubernetes": 600.0})
    assert progress.left_after("kubernetes", 100.0) == (500.0, None)
    assert progress.running("kubernetes", 100.0).endswith(
        "about 8.3 min left for it (from this machine's last build)"
    )
    assert progress.started("etcd") == "[1 of 2]"
    assert progress.running("etcd", 30.0) == "etcd: 30 s so far"


def test_an_image_builds_estimate_is_this_machines_slowest_build_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCGRPO_CACHE", str(tmp_path))
    [trainer] = [image for image in images() if image.name == "trainer-cpu"]
    assert estimate(trainer) == " (its first build on this machine: minutes)"
    (tmp_path / "images").mkdir()
    records = [{"image": trainer.ref, "total_seconds": s} for s in (95.0, 300.0)]
    records.append({"image": "another/image:1", "total_seconds": 9000.0})
    (tmp_path / "images" / "build-times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert estimate(trainer).startswith(" (at most about 5 min: the slowest build here")


def test_a_failed_tests_report_shows_only_what_components_logged_during_it(tmp_path: Path) -> None:
    (tmp_path / "etcd.log").write_text("started\n")
    (tmp_path / "kube-apiserver.log").write_text("started\n")
    before = log_sizes(tmp_path)
    with (tmp_path / "kube-apiserver.log").open("a") as fh:
        fh.write("".join(f"line {i}\n" for i in range(50)))
    (tmp_path / "kwok.log").write_text("new component\n")
    during = logged_during(tmp_path, before)
    assert set(during) == {"kube-apiserver", "kwok"}  # etcd logged nothing during the test
    assert during["kube-apiserver"].splitlines() == [f"line {i}" for i in range(10, 50)]


def test_a_kueue_started_with_another_configuration_is_not_taken_as_configured(tmp_path: Path) -> None:
    assert not kueue.configured(tmp_path)  # none written yet
    current = kueue.config(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(current, sort_keys=False))
    assert kueue.configured(tmp_path)
    older = {
        **current,
        "integrations": {"frameworks": list(kueue.FRAMEWORKS)},
    }  # before the job was a framework
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(older, sort_keys=False))
    assert not kueue.configured(tmp_path)
