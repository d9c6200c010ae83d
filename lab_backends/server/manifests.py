"""Render ``deploy/`` (plain manifests + a Kustomize subset) offline, without kubectl or Helm.

Why our own renderer: neither ``helm`` nor ``kustomize`` can be installed from this project's
package sources (PyPI has no real Helm; Debian has neither), yet ``make test`` must validate what
an instructor applies. The manifests are plain YAML, so rendering is small: follow
``resources``, set ``namespace`` on namespaced objects, add ``labels`` to ``metadata.labels`` and
rewrite ``images``. Anything else in a kustomization is refused loudly rather than half-applied;
where ``kubectl`` happens to be installed, tests/test_deploy.py compares with ``kubectl kustomize``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from lab_backends.errors import DeployError

#: Kustomization fields this renderer understands (the ones deploy/ uses).
SUPPORTED = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}
#: Kinds that have no namespace (the subset that can appear in deploy/).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass",
                  "APIService", "CustomResourceDefinition", "PriorityClass"}


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of one manifest file."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except yaml.YAMLError as exc:
        raise DeployError(f"{path} is not valid YAML: {exc}") from exc
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise DeployError(f"{path}: every document needs apiVersion and kind; fix or remove {str(doc)[:80]}")
    return docs


def render(folder: str | Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize <folder>`` would print, in ``resources`` order."""
    folder = Path(folder)
    kfile = folder / "kustomization.yaml"
    if not kfile.is_file():
        raise DeployError(f"{folder} has no kustomization.yaml; point at a folder of deploy/ (e.g. deploy/triton)")
    spec = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise DeployError(
            f"{kfile} uses {', '.join(sorted(unknown))}, which lab_backends.server.manifests does not render; "
            f"keep to {', '.join(sorted(SUPPORTED))} or extend the renderer (and its test)"
        )
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        target = folder / entry
        if target.is_dir():
            objects.extend(render(target))
        elif target.is_file():
            objects.extend(copy.deepcopy(load_documents(target)))
        else:
            raise DeployError(f"{kfile} lists resource '{entry}', but {target} does not exist")
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if spec.get("namespace") and obj["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = spec["namespace"]
        for label_set in spec.get("labels", []):
            meta.setdefault("labels", {}).update(label_set.get("pairs", {}))
        for image in spec.get("images", []):
            _rewrite_images(obj, image)
    return objects


def _rewrite_images(obj: dict[str, Any], rule: dict[str, str]) -> None:
    """Apply one ``images`` rule to every container of a workload's pod template."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name, _, tag = container.get("image", "").partition(":")
        if name == rule["name"]:
            container["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag or 'latest')}"


def containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container of every workload in ``objects`` (for the agreement checks)."""
    found = []
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        found.extend(pod.get("containers", []))
    return found
