"""Reply models: one pydantic model per prompt that is both the schema sent as structured output and the parser.

Each projector's prompt module declares the items its reply holds as a
:class:`ReplyItem` (in the style of Graphiti's prompt models) and wraps them in a
:class:`ListReply`. From that one declaration come

* ``schema()``: the ``{"name", "schema"}`` JSON schema ``models.llm`` sends as
  ``response_format`` where the provider supports it (lists wrapped in an object,
  because OpenAI's strict schemas want an object at the top);
* ``parse(text)``: the items of a reply, tolerant as every projector needs
  (``jsonparse``: fences, prose around the JSON, trailing commas, an array cut off by
  the token limit; the object form or a bare array), and how many items were
  malformed, which the projector records as dropped output.

An item's fields are declared with the types the *schema* asks for; ``mode="before"``
validators coerce what models actually send (``"42"`` for 42, a float id dropped, a
missing list as empty), so a sloppy but usable item is kept and only an item of the
wrong shape counts as malformed. A field typed ``Loose`` takes any JSON value and is
checked later by the projector (a date it parses itself), while the schema still
says what to send.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, WithJsonSchema, field_validator

from familiar_pipeline.models.jsonparse import as_int_list, coerce_json_items

__all__ = ["IdList", "ListReply", "Loose", "ReplyItem", "field_validator", "loose"]


def loose(schema: dict[str, Any]) -> Any:
    """A field that accepts any JSON value while the schema sent to the model says ``schema``."""
    return Annotated[Any, WithJsonSchema(schema)]


Loose = loose({"type": "string"})


class ReplyItem(BaseModel):
    """One item of a model's reply. Unknown keys are ignored; `schema_required` lists what the schema
    marks required (parsing may still tolerate its absence through a default)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    schema_required: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def item_schema(cls) -> dict[str, Any]:
        """The item's JSON schema as sent to the model: types and bounds only (no titles, no defaults)."""
        full = cls.model_json_schema()
        properties = {name: _plain(prop) for name, prop in full.get("properties", {}).items()}
        required = list(cls.schema_required) if cls.schema_required else list(full.get("required", []))
        return {"type": "object", "properties": properties, "required": required}


def _plain(prop: dict[str, Any]) -> dict[str, Any]:
    prop = {k: v for k, v in prop.items() if k not in ("title", "default")}
    if "items" in prop and isinstance(prop["items"], dict):
        prop["items"] = _plain(prop["items"])
    return prop


def id_list(value: Any) -> list[int]:
    """Integer ids of a model-supplied list, in order, each once (see ``jsonparse.as_int_list``)."""
    return list(dict.fromkeys(as_int_list(value)))


IdList = Annotated[list[int], WithJsonSchema({"type": "array", "items": {"type": "integer"}})]

Item = TypeVar("Item", bound=ReplyItem)


class ListReply(Generic[Item]):
    """A reply that is a list of items under ``key``: ``{"<key>": [item, ...]}`` (or the bare array)."""

    def __init__(self, name: str, key: str, item: type[Item]):
        self.name, self.key, self.item = name, key, item

    def schema(self) -> dict[str, Any]:
        """``{"name", "schema"}`` as ``models.llm`` sends it (see module doc)."""
        return {
            "name": self.name,
            "schema": {"type": "object", "properties": {self.key: {"type": "array", "items": self.item.item_schema()}},
                       "required": [self.key]},
        }

    def parse(self, text: str | None) -> tuple[list[Item], int]:
        """The well-shaped items, and how many were malformed or cut off (a reply of no list shape counts as one)."""
        value, cut_off = coerce_json_items(text or "", self.key)
        if not isinstance(value, list):
            return [], (1 if (text or "").strip() else 0)
        return self.items(value, cut_off)

    def items(self, value: list[Any], cut_off: int = 0) -> tuple[list[Item], int]:
        """The well-shaped items of an already parsed list, and how many were malformed (plus ``cut_off``)."""
        items: list[Item] = []
        malformed = cut_off
        for raw in value:
            try:
                items.append(self.item.model_validate(raw))
            except ValidationError:
                malformed += 1
        return items, malformed
