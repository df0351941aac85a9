"""Reports of the commands whose result has no dataclass of its own elsewhere.

(pack, inspect, build, verify, install and serve-args report through dataclasses of their own
modules; text views of all of them are in cachebake.cli.render.)
"""

from __future__ import annotations

from dataclasses import dataclass

from cachebake.artifact.fingerprint import Fingerprint


@dataclass
class RecipesReport:
    recipes: list  # cachebake.recipes.Recipe

    def to_dict(self) -> dict:
        return {"recipes": [{"recipe": r.ref, "model_id": r.model_id, "architecture": r.architecture,
                             "mamba": r.mamba_shapes(), "serve_args": r.serve_args,
                             "source_url": r.source_url, "notes": r.notes} for r in self.recipes]}


@dataclass
class FingerprintReport:
    fingerprint: Fingerprint
    out: str | None = None  # the file it was written to, if any

    @property
    def target(self) -> str:
        return self.fingerprint.target

    def to_dict(self) -> dict:
        # `install --fingerprint FILE` reads the "fingerprint" field of this document
        d = {"target": self.target, "fingerprint": self.fingerprint.to_json()}
        if self.out:
            d["out"] = self.out
        return d
