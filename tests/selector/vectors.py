"""Loading spec/vectors/*.json, decoding the language-neutral value encoding into Python values."""
from __future__ import annotations

import json
import math
from pathlib import Path

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"


def load(name: str) -> dict:
    with open(VECTORS / name, encoding="utf-8") as f:
        return json.load(f)


def decode(value: object) -> object:
    """{"$long": "..."} -> int, {"$double": "NaN"} -> float, {"$untyped": "9"} -> what the broker makes of a
    header with no declared type (pymq.selector._ir.untyped); other JSON values map as json does."""
    if isinstance(value, dict):
        if "$untyped" in value:
            from pymq.selector._ir import untyped
            return untyped(value["$untyped"])
        if "$long" in value:
            return int(value["$long"])
        if "$double" in value:
            return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[value["$double"]]
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def case_values(doc: dict, case: dict) -> dict:
    raw = doc["value_sets"][case["values_ref"]] if "values_ref" in case else case["values"]
    return {k: decode(v) for k, v in raw.items()}


RESULTS = {"TRUE": True, "FALSE": False, "UNKNOWN": None}
