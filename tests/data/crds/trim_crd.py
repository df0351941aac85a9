"""Trim a published CRD to what tests/test_distribute_sign.py validates against (README.md here).

    python3 tests/data/crds/trim_crd.py UPSTREAM.yaml VERSION OUT.json

Keeps the CRD's identity (apiVersion, kind, metadata.name, spec.group, spec.names, spec.scope)
and the one version VERSION with its name, served, storage and schema.openAPIV3Schema; drops
every other version and every `description` of a schema node (documentation, not constraints).
Nothing else changes: types, enums, patterns, required, formats, x-kubernetes-* stay as
published.  Writes sorted, indented JSON so a re-trim of the same upstream file is
byte-identical."""

import json
import sys

import yaml


def strip_descriptions(node):
    """A schema node minus its `description`; `properties` maps property names (one may be
    called "description") to schema nodes, so its keys are kept and its values stripped."""
    if isinstance(node, list):
        return [strip_descriptions(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description" and not isinstance(value, dict):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: strip_descriptions(sub) for name, sub in value.items()}
        else:
            out[key] = strip_descriptions(value)
    return out


def trim(crd: dict, version: str) -> dict:
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    spec = crd["spec"]
    return {"apiVersion": crd["apiVersion"], "kind": crd["kind"],
            "metadata": {"name": crd["metadata"]["name"]},
            "spec": {"group": spec["group"], "names": spec["names"], "scope": spec["scope"],
                     "versions": [{"name": v["name"], "served": v["served"], "storage": v["storage"],
                                   "schema": {"openAPIV3Schema":
                                              strip_descriptions(v["schema"]["openAPIV3Schema"])}}]}}


if __name__ == "__main__":
    src, version, dst = sys.argv[1:4]
    with open(src) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    (crd,) = docs
    with open(dst, "w") as f:
        json.dump(trim(crd, version), f, indent=1, sort_keys=True)
        f.write("\n")
