"""Validate a manifest against a CustomResourceDefinition's structural schema, as the API server would.

The CRDs are the engine's own, verbatim at the pinned tags (tests/data/crds, with their provenance,
license and SHA256SUMS, which every read checks). Unknown fields
are errors (the API server prunes or rejects them), `x-kubernetes-int-or-string` takes either,
`x-kubernetes-preserve-unknown-fields` keeps anything below it; patterns, lengths, item counts,
int32/int64 bounds and list-map keys are checked. CEL rules are checked by the tests.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache

import yaml

from bootstrap.paths import REPO

CRDS = REPO / "tests" / "data" / "crds"
FILES = {
    "JobSet": "jobset-v0.10.1_jobset.x-k8s.io_jobsets.yaml",
    "ResourceFlavor": "kueue-v0.17.1_kueue.x-k8s.io_resourceflavors.yaml",
    "ClusterQueue": "kueue-v0.17.1_kueue.x-k8s.io_clusterqueues.yaml",
    "LocalQueue": "kueue-v0.17.1_kueue.x-k8s.io_localqueues.yaml",
}
ROOT_KEYS = ("apiVersion", "kind")
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float)}


@cache
def schema(kind: str, api_version: str) -> dict:
    """The openAPIV3Schema of `kind` at the version `api_version` names; the version must be served."""
    crd = yaml.safe_load(_verified(FILES[kind]))
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group, (kind, api_version)
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert found["served"], f"{api_version} {kind} is not served"
    return found["schema"]["openAPIV3Schema"]


def _verified(name: str) -> str:
    """A CRD file's text, once its SHA-256 matches SHA256SUMS: an edited copy is not the engine's schema."""
    sums = dict(reversed(line.split()) for line in (CRDS / "SHA256SUMS").read_text().splitlines())
    data = (CRDS / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sums[name], f"{CRDS / name} differs from its upstream copy"
    return data.decode()


def errors(manifest: dict) -> list[str]:
    """Every way `manifest` breaks its CRD's schema, each with the path to it. (The root `metadata` is
    ObjectMeta, which the API server checks itself: see `object_meta_errors`.)"""
    body = {k: v for k, v in manifest.items() if k != "metadata"}
    return _check(body, schema(manifest["kind"], manifest["apiVersion"]), manifest["kind"])


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def object_meta_errors(meta: dict) -> list[str]:
    """ObjectMeta as the API server checks it: a DNS-1123 name, label values of 63 characters."""
    found = [] if len(meta["name"]) <= 63 and DNS_LABEL.fullmatch(meta["name"]) else [f"name {meta['name']!r}"]
    for key, value in meta.get("labels", {}).items():
        if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            found.append(f"label {key}={value!r}")
    return found


def _check(value, node: dict, path: str) -> list[str]:
    if value is None:
        return [] if node.get("nullable") else [f"{path}: null"]
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: not int or string"]
        if isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
            return [f"{path}: {value!r} does not match {node['pattern']}"]  # a quantity, say
        return []
    kind = node.get("type")
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: {value!r} is not an integer"]
        bits = {"int32": 31, "int64": 63}.get(node.get("format", ""))
        if bits and not -(2**bits) <= value < 2**bits:
            return [f"{path}: {value} does not fit {node['format']}"]
    elif kind in TYPES and (not isinstance(value, TYPES[kind]) or (kind == "number" and isinstance(value, bool))):
        return [f"{path}: {value!r} is not {kind}"]
    found = []
    if "enum" in node and value not in node["enum"]:
        found.append(f"{path}: {value!r} is not one of {node['enum']}")
    if isinstance(value, str):
        if not node.get("minLength", 0) <= len(value) <= node.get("maxLength", len(value)):
            found.append(
                f"{path}: {len(value)} characters, outside {node.get('minLength', 0)}..{node.get('maxLength')}"
            )
        if "pattern" in node and not re.search(node["pattern"], value):
            found.append(f"{path}: {value!r} does not match {node['pattern']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            found.append(f"{path}: {value} < {node['minimum']}")
        if "maximum" in node and value > node["maximum"]:
            found.append(f"{path}: {value} > {node['maximum']}")
    if isinstance(value, list):
        if not node.get("minItems", 0) <= len(value) <= node.get("maxItems", len(value)):
            found.append(f"{path}: {len(value)} items, outside {node.get('minItems', 0)}..{node.get('maxItems')}")
        if node.get("x-kubernetes-list-type") == "map":  # e.g. containers by name, ports by port and protocol
            keys = node.get("x-kubernetes-list-map-keys", [])
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            if len(seen) != len(set(seen)):
                found.append(f"{path}: two items share the key {keys}")
        if node.get("x-kubernetes-list-type") == "set" and len(value) != len({repr(v) for v in value}):
            found.append(f"{path}: a set holds an item twice")
        for index, item in enumerate(value):
            found += _check(item, node.get("items", {}), f"{path}[{index}]")
    if isinstance(value, dict):
        properties = node.get("properties", {})
        found += [f"{path}: missing {key}" for key in node.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                found += _check(item, properties[key], f"{path}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):
                found += _check(item, node["additionalProperties"], f"{path}.{key}")
            elif not node.get("x-kubernetes-preserve-unknown-fields") and (path.count(".") or key not in ROOT_KEYS):
                found.append(f"{path}.{key}: unknown field")
    return found
