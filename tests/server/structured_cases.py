"""What the structured output checks share (standard library only, so the GPU machines' script
scripts/device/serve_structured.py imports it too): the tools, the nested order schema, and a
validator for the subset of JSON Schema they use, and Qwen2.5's chat template for a random model
(Hermes <tool_call> tags, so tools render and parse as on a real checkpoint)."""
import json
import os

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}}

# Nested objects, enums, arrays, booleans, bounded strings and numbers (the issue's constrained stream).
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 12},
            "tier": {"type": "string", "enum": ["free", "pro", "team"]}},
            "required": ["name", "tier"], "additionalProperties": False},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {
                "sku": {"type": "string", "enum": ["A1", "B2", "C3"]},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["sku", "quantity"], "additionalProperties": False}},
        "gift": {"type": "boolean"},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
    },
    "required": ["customer", "items", "gift", "note"],
    "additionalProperties": False,
}


def validate(value, schema, where="$"):
    """The subset of JSON Schema the tests' schemas use; raises AssertionError naming the place."""
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                return validate(value, option, where)
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{where}: no anyOf option matches: {errors}")
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {value!r} is not an integer"
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), f"{where}: {value} out of range"
    elif kind:
        assert isinstance(value, checks[kind]), f"{where}: {value!r} is not a {kind}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if kind == "string" and "maxLength" in schema:
        assert len(value) <= schema["maxLength"], f"{where}: {value!r} longer than {schema['maxLength']}"
    if kind == "array":
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)), f"{where}: length"
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{where}[{i}]")
    if kind == "object":
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            assert key in value, f"{where}: missing {key}"
        for key, item in value.items():
            if key in properties:
                validate(item, properties[key], f"{where}.{key}")
            else:
                assert schema.get("additionalProperties", True) is not False, f"{where}: extra property {key}"


def use_qwen_template(model_dir, fixtures):
    """Gives the checkpoint in `model_dir` (`deepfuse make-model`'s) the chat template of
    tests/fixtures/tokenizers/qwen2_bytelevel."""
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    with open(os.path.join(fixtures, "tokenizers", "qwen2_bytelevel", "tokenizer_config.json")) as f:
        config["chat_template"] = json.load(f)["chat_template"]
    with open(config_path, "w") as f:
        json.dump(config, f)
