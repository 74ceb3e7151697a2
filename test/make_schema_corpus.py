# makes test/schemas/corpus.json: the json schemas test/test_structured.py runs through the
# compiler (grammar_gen) and the real engine, each {"name", "source", "schema"}:
#   pydantic: models as the frameworks write them (pydantic-ai, openai-agents, langchain and
#     the sdks' parse() all start from pydantic's model_json_schema), as pydantic emits them,
#     in the openai sdk's strict form (openai.lib._pydantic.to_strict_json_schema, what
#     chat.completions.parse sends) and in the anthropic sdk's form (transform_schema, what
#     messages.parse sends)
#   suite: the shapes of the JSON-Schema-Test-Suite's draft 2020-12 keyword files (type,
#     enum, const, properties / required / additionalProperties, items / prefixItems /
#     minItems / maxItems, min/maxLength, pattern, format, minimum / maximum / exclusive*,
#     anyOf / oneOf / allOf, $ref / $defs, recursion, boolean schemas), written out here
# plus "refused": schemas with keywords the compiler does not support, each with the word
# its error must name. deterministic: run it again and the file is the same.
#   python3 test/make_schema_corpus.py test/schemas/corpus.json
import datetime
import enum
import json
import sys
import uuid
from typing import Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, Field
from typing_extensions import Annotated

from openai.lib._pydantic import to_strict_json_schema
from anthropic.lib._parse._transform import transform_schema


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    street: str
    city: str = Field(max_length=30)
    zip: str = Field(pattern=r"^\d{5}$")


class User(BaseModel):
    name: str
    age: int = Field(ge=0, le=130)
    email: Optional[str] = None
    address: Address


class CityLocation(BaseModel):  # pydantic-ai's docs example
    city: str
    country: str


class Weather(BaseModel):  # the openai-agents / langchain tutorials' shape
    location: str
    temperature_c: float = Field(ge=-90, le=60)
    conditions: Literal["sunny", "cloudy", "rain", "snow"]


class Joke(BaseModel):  # langchain's with_structured_output example
    setup: str = Field(description="The setup of the joke")
    punchline: str = Field(description="The punchline to the joke")
    rating: Optional[int] = Field(default=None, description="How funny the joke is, from 1 to 10", ge=1, le=10)


class CalendarEvent(BaseModel):  # the openai sdk's parse() example
    name: str
    date: str
    participants: List[str]


class Step(BaseModel):
    explanation: str
    output: str


class MathReasoning(BaseModel):  # openai's structured-outputs guide
    steps: List[Step]
    final_answer: str


class TreeNode(BaseModel):  # recursion
    value: int
    children: List["TreeNode"] = []


class LinkedList(BaseModel):
    head: int
    tail: Optional["LinkedList"] = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):  # a discriminated union
    pet: Union[Cat, Dog] = Field(discriminator="kind")
    owner: str


class Inventory(BaseModel):
    items: Dict[str, int]
    tags: List[Color]
    dims: Tuple[int, int, int]


class Meeting(BaseModel):
    id: uuid.UUID
    day: datetime.date
    starts: datetime.datetime
    room: Annotated[str, Field(min_length=1, max_length=8)]


class Verse(BaseModel):  # what the kjv tests ask for
    book: str = Field(max_length=16)
    chapter: int = Field(ge=1, le=150)
    text: str = Field(max_length=60)


class Deep5(BaseModel):
    e: int


class Deep4(BaseModel):
    d: Deep5
    n: List[Deep5]


class Deep3(BaseModel):
    c: Deep4


class Deep2(BaseModel):
    b: Deep3
    alt: Optional[Deep4] = None


class Deep1(BaseModel):
    a: Deep2


class Scores(BaseModel):
    values: List[float] = Field(min_length=1, max_length=5)
    best: Optional[float] = None
    flags: List[bool] = []


class Contact(BaseModel):
    kind: Union[Literal["email"], Literal["phone"]]
    value: str


class Person(BaseModel):
    first: str
    last: str
    contacts: List[Contact] = Field(max_length=3)
    spouse: Optional["Person"] = None


class Extraction(BaseModel):  # pydantic-ai's multi-field extraction shape
    names: List[str]
    dates: List[datetime.date]
    amount: Optional[float]
    currency: Optional[Literal["USD", "EUR", "GBP"]]


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    confidence: float = Field(ge=0, le=1)


class Todo(BaseModel):
    title: str
    done: bool = False
    priority: int = Field(default=3, ge=1, le=5)


class TodoList(BaseModel):
    todos: List[Todo]
    owner: Optional[User] = None


PYDANTIC = [Address, User, CityLocation, Weather, Joke, CalendarEvent, MathReasoning, TreeNode, LinkedList, Pet, Inventory,
            Meeting, Verse, Deep1, Scores, Person, Extraction, Sentiment, Todo, TodoList]

SUITE = {
    "type-string": {"type": "string"},
    "type-integer": {"type": "integer"},
    "type-number": {"type": "number"},
    "type-boolean": {"type": "boolean"},
    "type-null": {"type": "null"},
    "type-array-of-types": {"type": ["integer", "string", "null"]},
    "type-object-any": {"type": "object"},
    "type-array-any": {"type": "array"},
    "true-schema": True,
    "empty-schema": {},
    "enum-strings": {"enum": ["foo", "bar", "baz"]},
    "enum-mixed": {"enum": [1, "one", None, True, [1, 2], {"k": "v"}]},
    "enum-escapes": {"enum": ["a\"b", "back\\slash", "new\nline", "caf\u00e9", "\u2603"]},
    "const-object": {"const": {"a": 1, "b": [True, None]}},
    "const-string": {"const": "exactly this"},
    "properties-required": {"type": "object", "properties": {"foo": {"type": "integer"}, "bar": {"type": "string"}}, "required": ["foo"]},
    "properties-none-required": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}},
    "additional-false": {"type": "object", "properties": {"foo": {"type": "string"}}, "additionalProperties": False},
    "additional-schema": {"type": "object", "properties": {"foo": {}, "bar": {}}, "additionalProperties": {"type": "boolean"}},
    "additional-only": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
    "additional-true-with-props": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": True},
    "empty-key": {"type": "object", "properties": {"": {"type": "integer"}, "a b": {"type": "null"}}, "required": [""]},
    "escaped-keys": {"type": "object", "properties": {"quo\"te": {"type": "integer"}, "tab\there": {"type": "string"}}, "required": ["quo\"te", "tab\there"]},
    "items-schema": {"type": "array", "items": {"type": "integer"}},
    "items-nested": {"type": "array", "items": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
    "items-false": {"type": "array", "items": False},
    "prefix-items": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
    "prefix-items-closed": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": False, "minItems": 2},
    "prefix-items-then-items": {"type": "array", "prefixItems": [{"const": "head"}], "items": {"type": "number"}, "maxItems": 4},
    "min-items": {"type": "array", "items": {"type": "boolean"}, "minItems": 2},
    "max-items": {"type": "array", "items": {"type": "null"}, "maxItems": 2},
    "min-max-items": {"type": "array", "minItems": 1, "maxItems": 1},
    "min-length": {"type": "string", "minLength": 2},
    "max-length": {"type": "string", "maxLength": 2},
    "min-max-length": {"type": "string", "minLength": 3, "maxLength": 5},
    "pattern-anchored": {"type": "string", "pattern": "^[a-z]{2,4}-[0-9]+$"},
    "pattern-search": {"type": "string", "pattern": "abc"},
    "pattern-alternation": {"type": "string", "pattern": "^(cat|dog|bird)s?$"},
    "pattern-classes": {"type": "string", "pattern": "^\\w+\\s\\d{2}\\.\\S$"},
    "pattern-negated": {"type": "string", "pattern": "^[^aeiou]{3}$"},
    "pattern-escapes": {"type": "string", "pattern": "^\\(\\d{3}\\) \\d{3}-\\d{4}$"},
    "pattern-unicode": {"type": "string", "pattern": "^caf\u00e9[!?]$"},
    "pattern-dot": {"type": "string", "pattern": "^a.c$"},
    "pattern-optional-group": {"type": "string", "pattern": "^v\\d+(\\.\\d+){0,2}(-beta)?$"},
    "format-date": {"type": "string", "format": "date"},
    "format-date-time": {"type": "string", "format": "date-time"},
    "format-time": {"type": "string", "format": "time"},
    "format-uuid": {"type": "string", "format": "uuid"},
    "format-email": {"type": "string", "format": "email"},
    "minimum": {"type": "number", "minimum": 1.0},
    "maximum": {"type": "number", "maximum": 3},
    "exclusive-minimum": {"type": "number", "exclusiveMinimum": 1},
    "exclusive-maximum": {"type": "number", "exclusiveMaximum": 3},
    "integer-range": {"type": "integer", "minimum": -5, "maximum": 5},
    "integer-big-range": {"type": "integer", "minimum": 1000, "maximum": 987654},
    "integer-negative-range": {"type": "integer", "minimum": -300, "maximum": -12},
    "integer-exclusive": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    "number-range-neg": {"type": "number", "minimum": -2, "maximum": 2},
    "number-lower-neg": {"type": "number", "minimum": -50},
    "any-of": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    "any-of-objects": {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
                                 {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"], "additionalProperties": False}]},
    "one-of-disjoint": {"oneOf": [{"type": "boolean"}, {"type": "null"}, {"type": "array", "maxItems": 0}]},
    "all-of-single": {"allOf": [{"type": "string", "maxLength": 4}]},
    "ref-defs": {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "object",
                 "properties": {"x": {"$ref": "#/$defs/pos"}, "y": {"$ref": "#/$defs/pos"}}, "required": ["x", "y"]},
    "ref-definitions": {"definitions": {"s": {"type": "string", "maxLength": 2}}, "type": "array", "items": {"$ref": "#/definitions/s"}},
    "ref-pointer-into-properties": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"$ref": "#/properties/a"}}, "required": ["a", "b"]},
    "ref-escaped-pointer": {"$defs": {"a/b": {"type": "null"}, "c~d": {"type": "boolean"}}, "type": "array",
                            "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}]},
    "recursive-root": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
                       "required": ["name"], "additionalProperties": False},
    "recursive-json": {"$defs": {"json": {"anyOf": [{"type": "null"}, {"type": "boolean"}, {"type": "number"}, {"type": "string"},
                                                      {"type": "array", "items": {"$ref": "#/$defs/json"}},
                                                      {"type": "object", "additionalProperties": {"$ref": "#/$defs/json"}}]}},
                       "$ref": "#/$defs/json"},
    "mutual-recursion": {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "additionalProperties": False},
                                   "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 2}}, "$ref": "#/$defs/a"},
    "nested-deep": {"type": "object", "properties": {"l1": {"type": "object", "properties": {"l2": {"type": "object", "properties": {
        "l3": {"type": "object", "properties": {"l4": {"type": "object", "properties": {"l5": {"type": "array", "items": {"type": "object",
        "properties": {"l6": {"type": "string", "enum": ["x", "y"]}}, "required": ["l6"]}}}, "required": ["l5"]}}, "required": ["l4"]}},
        "required": ["l3"]}}, "required": ["l2"]}}, "required": ["l1"]},
    "annotations-only": {"title": "T", "description": "D", "default": 3, "examples": [1], "$comment": "c", "type": "integer", "deprecated": False},
    "nullable-union": {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    "array-of-enums": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 4},
    "object-in-array-in-object": {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object",
                                  "properties": {"k": {"type": "string", "maxLength": 4}, "v": {"type": "number"}}, "required": ["k", "v"],
                                  "additionalProperties": False}}}, "required": ["rows"], "additionalProperties": False},
    "string-enum-with-type": {"type": "string", "enum": ["x", 1, "y"]},
    "boolean-false-items-prefix": {"prefixItems": [{"type": "integer"}], "items": False},
    "draft7-style-definitions-ref": {"definitions": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/definitions/node"}, {"type": "null"}]}},
                                                              "required": ["next"]}}, "$ref": "#/definitions/node"},
    "schema-keyword": {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:x", "type": "boolean"},
}

REFUSED = {
    "min-properties": ({"type": "object", "minProperties": 1}, "minProperties"),
    "max-properties": ({"type": "object", "maxProperties": 2}, "maxProperties"),
    "unique-items": ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    "contains": ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    "multiple-of": ({"type": "integer", "multipleOf": 5}, "multipleOf"),
    "not": ({"not": {"type": "string"}}, "not"),
    "if-then-else": ({"if": {"type": "integer"}, "then": {"minimum": 0}}, "if"),
    "pattern-properties": ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
    "property-names": ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
    "dependent-required": ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    "format-uri": ({"type": "string", "format": "uri"}, "uri"),
    "format-ipv4": ({"type": "string", "format": "ipv4"}, "ipv4"),
    "remote-ref": ({"$ref": "https://example.com/schema.json"}, "$ref"),
    "all-of-many": ({"allOf": [{"type": "integer"}, {"minimum": 2}]}, "allOf"),
    "fraction-bound": ({"type": "number", "minimum": 0.25}, "minimum"),
    "backreference": ({"type": "string", "pattern": "^(a)\\1$"}, "\\1"),
    "lookahead": ({"type": "string", "pattern": "^(?=a)a$"}, "lookaround"),
    "unevaluated": ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties"),
    "nested-unsupported": ({"type": "object", "properties": {"deep": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}}},
                           "contentEncoding"),
    "false-schema": (False, "matches nothing"),
}


def main():
    out = sys.argv[1]
    corpus = []
    for m in PYDANTIC:
        corpus.append({"name": "pydantic-" + m.__name__, "source": "pydantic model_json_schema", "schema": m.model_json_schema()})
        corpus.append({"name": "openai-strict-" + m.__name__, "source": "openai sdk to_strict_json_schema", "schema": to_strict_json_schema(m)})
        corpus.append({"name": "anthropic-" + m.__name__, "source": "anthropic sdk transform_schema",
                       "schema": transform_schema(m.model_json_schema())})
    for name, s in SUITE.items():
        corpus.append({"name": "suite-" + name, "source": "JSON-Schema-Test-Suite shape", "schema": s})
    refused = [{"name": "refused-" + k, "schema": s, "names": w} for k, (s, w) in REFUSED.items()]
    with open(out, "w") as f:
        json.dump({"corpus": corpus, "refused": refused}, f, indent=1, sort_keys=False, ensure_ascii=False)
        f.write("\n")
    print(f"{out}: {len(corpus)} schemas, {len(refused)} refused", file=sys.stderr)


if __name__ == "__main__":
    main()
