"""Language tags as IIIF 3.0 keys its values by: one rule for what the configuration names (manifests'
default_language, OTMM's metadata_language) and for what sources and embedded metadata give."""
from __future__ import annotations

import re

# IIIF 3.0's `none`, or BCP 47's shape: a 2- or 3-letter language (every registered one is), then subtags; letters
# only, as IIIF 3.0 (iiif-prezi3, the schema) accepts a key
LANGUAGE = re.compile(r"^(none|[a-zA-Z]{2,3}(-[a-zA-Z]{1,8})*)$")


def language_tag(language: str | None) -> str | None:
    """`language` as a IIIF language key (`none` included): a POSIX locale (en_US.UTF-8, de_DE@euro) as BCP 47
    (en-US). None for no language: none given, empty, or XMP's x-default. ValueError for what is still no tag
    (`en US`, `*`, `english`)."""
    tag = re.split(r"[.@]", language or "", maxsplit=1)[0].strip().replace("_", "-")
    if tag.lower() in ("", "x-default"):
        return None
    if not LANGUAGE.match(tag):
        raise ValueError(f"{language!r} is not a language tag such as en or en-US")
    return tag
