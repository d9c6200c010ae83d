"""deploy/: the class on Kubernetes, validated offline (no cluster, no kubectl, no Helm needed).

Every rendered manifest passes kubernetes-validate in strict mode for two Kubernetes versions (a
missing schema for a Kubernetes API group is a failure, not a warning); the Zero-to-JupyterHub
values are checked by building the pod spec they configure and validating that too; and the image
tag, ports, options and metric names agree with the rest of the project and with what a real
embedded Triton exports.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from lab_backends.errors import DeployError
from lab_backends.measure.stats import parse_metrics, scrape_metrics
from lab_backends.paths import PROJECT_ROOT
from lab_backends.server.docker import CONTAINER_PORTS, LAB_TRITON_IMAGE, NGC_TRITON_IMAGE
from lab_backends.server.manifests import containers, render

DEPLOY = PROJECT_ROOT / "deploy"
#: The oldest release without autoscaling/v2beta2 (removed in 1.26) and a recent one.
K8S_VERSIONS = ("1.26.0", "1.33.0")


def _core_group(api_version: str) -> bool:
    """Kubernetes' own API groups: "v1", "apps/v1", "networking.k8s.io/v1"... (not keda.sh)."""
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def validate_strict(obj: dict, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        if _core_group(obj["apiVersion"]):
            raise  # e.g. autoscaling/v2beta2 on 1.26+: the object would be refused by the cluster


@pytest.fixture(scope="module")
def triton() -> list[dict]:
    return render(DEPLOY / "triton")


def _one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("folder", ["triton", "keda"])
def test_rendered_manifests_validate_strictly(folder: str, version: str) -> None:
    objects = render(DEPLOY / folder)
    assert objects
    for obj in objects:
        validate_strict(obj, version)


def test_validation_can_fail(triton: list[dict]) -> None:
    """The checks above would catch a typo and the removed HPA version NVIDIA's chart still uses."""
    sts = _one(triton, "StatefulSet")
    bad = yaml.safe_load(yaml.safe_dump(sts))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(bad, K8S_VERSIONS[0])
    old_hpa = dict(_one(triton, "HorizontalPodAutoscaler"), apiVersion="autoscaling/v2beta2")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_strict(old_hpa, K8S_VERSIONS[0])


def test_renderer_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [a.yaml]\npatches: []\n")
    with pytest.raises(DeployError, match="patches"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(DeployError, match="missing.yaml"):
        render(tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed (optional cross-check)")
@pytest.mark.parametrize("folder", ["triton", "keda"])
def test_renderer_agrees_with_kubectl_kustomize(folder: str) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY / folder)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    theirs = [d for d in yaml.safe_load_all(out) if d]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(render(DEPLOY / folder), key=key) == sorted(theirs, key=key)


def test_shared_triton_shape(triton: list[dict]) -> None:
    kinds = sorted(o["kind"] for o in triton)
    assert kinds == sorted(["Namespace", "PersistentVolumeClaim", "StatefulSet", "Service", "Service",
                            "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"])
    sts = _one(triton, "StatefulSet")
    (c,) = containers([sts])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    headless = [o for o in triton if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None"]
    assert [h["metadata"]["name"] for h in headless] == [sts["spec"]["serviceName"]]
    # The admin key comes from a Secret, and only the Triton pod refers to it.
    (key_env,) = [e for e in c["env"] if e["name"] == "TRITON_ADMIN_KEY"]
    assert key_env["valueFrom"]["secretKeyRef"]["name"] == "triton-admin-key"
    restricted = [a for a in c["args"] if a.startswith(("--http-restricted-api", "--grpc-restricted-protocol"))]
    assert len(restricted) == 2 and all(a.endswith(":admin-key=$(TRITON_ADMIN_KEY)") for a in restricted)
    hpa = _one(triton, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "triton"}
    pdb = _one(triton, "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]


def test_image_ports_and_options_agree_with_the_project(triton: list[dict]) -> None:
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    sts = _one(triton, "StatefulSet")
    (c,) = containers([sts])
    ngc_tag = NGC_TRITON_IMAGE.rpartition(":")[2]
    assert c["image"].endswith(":" + ngc_tag)
    dockerfile = (DEPLOY / "images" / "triton-models.Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={LAB_TRITON_IMAGE}" in dockerfile  # built FROM docker/triton.Dockerfile's image
    assert compose["services"]["triton"]["image"] == LAB_TRITON_IMAGE
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == CONTAINER_PORTS
    for svc in (o for o in triton if o["kind"] == "Service"):
        assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == CONTAINER_PORTS
    assert {int(p.split(":")[2]) for p in compose["services"]["triton"]["ports"]} == set(CONTAINER_PORTS.values())
    # The same server options as the compose service, except the restricted APIs: statistics
    # stay open on a shared server (learners read counts without the key).
    compose_args = [a for a in compose["services"]["triton"]["command"][1:] if "restricted" not in a]
    assert [a for a in c["args"] if "restricted" not in a] == compose_args
    values = yaml.safe_load((DEPLOY / "jupyterhub" / "values.yaml").read_text())
    env = values["singleuser"]["extraEnv"]
    assert env["TRITON_URL"].endswith(f":{CONTAINER_PORTS['http']}")
    assert env["TRITON_GRPC_URL"].endswith(f":{CONTAINER_PORTS['grpc']}")
    assert f":{CONTAINER_PORTS['metrics']}/metrics" in env["TRITON_METRICS_URL"]
    assert env["TRITON_PODS"].startswith(sts["spec"]["serviceName"] + ".")


def test_singleuser_pod_from_the_jupyterhub_values_validates(triton: list[dict]) -> None:
    """The parts of the Z2JH values that become Kubernetes objects, assembled as the chart does."""
    values = yaml.safe_load((DEPLOY / "jupyterhub" / "values.yaml").read_text())
    user = values["singleuser"]
    assert "TRITON_ADMIN_KEY" not in user["extraEnv"], "learners never get the admin key"
    assert values["cull"]["enabled"] and values["cull"]["timeout"] > 0
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "jupyter-learner"},
        "spec": {
            "volumes": user["storage"]["extraVolumes"],
            "containers": [{
                "name": "notebook",
                "image": f"{user['image']['name']}:{user['image']['tag']}",
                "env": [{"name": k, "value": str(v)} for k, v in user["extraEnv"].items()],
                "resources": {
                    "requests": {"cpu": str(user["cpu"]["guarantee"]), "memory": user["memory"]["guarantee"]},
                    "limits": {"cpu": str(user["cpu"]["limit"]), "memory": user["memory"]["limit"]},
                },
                "volumeMounts": user["storage"]["extraVolumeMounts"],
            }],
        },
    }
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "singleuser"},
              "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": user["networkPolicy"]["egress"]}}
    for version in K8S_VERSIONS:
        validate_strict(pod, version)
        validate_strict(policy, version)
    claim = _one(triton, "PersistentVolumeClaim")["metadata"]["name"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in user["storage"]["extraVolumes"]] == [claim]
    sts_labels = _one(triton, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert user["networkPolicy"]["egress"][0]["to"][0]["podSelector"]["matchLabels"].items() <= sts_labels.items()


def test_autoscaling_rules_name_the_hpa_metric(triton: list[dict]) -> None:
    hpa = _one(triton, "HorizontalPodAutoscaler")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    adapter = yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["seriesQuery"].startswith(metric + "{") and rule["name"]["as"] == metric
    assert "by (<<.GroupBy>>)" in rule["metricsQuery"] and "rate(" not in rule["metricsQuery"]  # a gauge
    (scaled,) = render(DEPLOY / "keda")
    assert scaled["spec"]["scaleTargetRef"] == hpa["spec"]["scaleTargetRef"]
    assert scaled["spec"]["triggers"][0]["metadata"]["query"].startswith(f"sum({metric}{{")


@pytest.mark.server
def test_metric_names_exist_on_a_real_server(start_server) -> None:
    """Every nv_* name deploy/ relies on is on the /metrics page of the embedded Triton 2.51."""
    server = start_server(models=["echo"])
    names = {name for name, _ in parse_metrics(scrape_metrics(server)).samples}
    used = set()
    for path in DEPLOY.rglob("*.yaml"):
        used |= set(re.findall(r"\bnv_[a-z_]+", path.read_text()))
    assert "nv_inference_pending_request_count" in used
    assert used <= names, f"not exported by Triton: {sorted(used - names)}"
