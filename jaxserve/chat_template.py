"""Chat templates: a model's Jinja template rendered as Hugging Face transformers renders it (host only).

``render_chat(template, conversation, add_generation_prompt=True, **special_tokens) -> str``. The environment
matches ``transformers``' ``apply_chat_template``: a sandbox, ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, ``raise_exception``, ``strftime_now`` and a ``tojson`` that keeps non-ASCII text.
"""
from __future__ import annotations

import datetime
import functools
import json
from typing import Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool")


class TemplateError(ValueError):
    """The template raised (``raise_exception``) or could not be rendered."""


def _raise_exception(message):
    raise TemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not parse: {e}") from None


def check_conversation(conversation, where: str = "conversation") -> list[dict]:
    """``conversation`` as a list of ``{"role", "content"}`` dicts; a clear ValueError naming the bad message."""
    if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence):
        raise ValueError(f"{where} must be a list of {{'role': ..., 'content': ...}} messages, "
                         f"got {type(conversation).__name__}")
    if not conversation:
        raise ValueError(f"{where} has no messages")
    for i, m in enumerate(conversation):
        if not isinstance(m, Mapping):
            raise ValueError(f"{where} message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ValueError(f"{where} message {i} has role {m.get('role')!r}; expected one of {ROLES}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{where} message {i} content must be a string, got {type(m.get('content')).__name__}")
    return [dict(m) for m in conversation]


def render_chat(template: str, conversation: Sequence[Mapping], add_generation_prompt: bool = True,
                **variables) -> str:
    """The prompt text ``template`` makes of ``conversation`` (``variables``: bos_token, eos_token, ...)."""
    messages = check_conversation(conversation)
    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          **variables)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed: {e}") from None
