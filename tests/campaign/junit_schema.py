"""Validate a JUnit file against the schema CI systems read (tests/data/junit.xsd)."""
from __future__ import annotations

import os
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent.parent / "data" / "junit.xsd"


def validate(path: str | os.PathLike[str], xsd: str | os.PathLike[str] = SCHEMA) -> list[str]:
    """Schema errors of a JUnit file (empty list = valid).

    Uses xmlschema, else lxml; raises RuntimeError when neither is installed (the dev
    extras include xmlschema).
    """
    try:
        import xmlschema
    except ImportError:
        xmlschema = None
    if xmlschema is not None:
        schema = xmlschema.XMLSchema(str(xsd))
        return [str(e.reason or e) for e in schema.iter_errors(str(path))]
    try:
        from lxml import etree
    except ImportError:
        raise RuntimeError("validating JUnit XML needs xmlschema or lxml (pip install xmlschema)") from None
    schema = etree.XMLSchema(etree.parse(str(xsd)))
    ok = schema.validate(etree.parse(str(path)))
    return [] if ok else [str(e) for e in schema.error_log]
