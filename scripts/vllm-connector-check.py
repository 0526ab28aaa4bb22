"""Checks the engine's --kv-transfer-config, as the plan prints it, against
the sources of each vLLM version that scripts/setup-vllm-sources.sh
unpacked, without installing vLLM or needing a GPU:

- vLLM's own KVTransferConfig (vllm/config/kv_transfer.py, with
  vllm/config/utils.py, whose config classes forbid unknown keys) parses
  the JSON as `vllm serve --kv-transfer-config` does (arg_utils'
  `_expand_json_human_readable_numbers`, then pydantic's
  `TypeAdapter(KVTransferConfig).validate_json`); vLLM's platform, logger
  and environment modules are stood in for, since they need a GPU or
  vLLM's dependencies and play no part in the parse;
- two controls that must be refused (a bad kv_role, an unknown key) show
  that the parse is the real one;
- the connector factory still registers LMCacheMPConnector, and vLLM's
  connector still reads the server's address from `lmcache.mp.host` and
  `lmcache.mp.port` of kv_connector_extra_config and names its KV after
  `vllm_config.model_config.model` (the launch identity's model).

Run with a Python that has pydantic 2 (the LMCache environment has it):

    $VENV/bin/python scripts/vllm-connector-check.py SOURCES VERSION... < config.json

It prints one JSON object per version and exits 0 when every version
accepts the config and keeps the connector's keys, 1 otherwise.
"""

import ast
import hashlib
import importlib.util
import json
import logging
import re
import sys
import types

CONNECTOR_DIR = "vllm/distributed/kv_transfer/kv_connector"
CONTROLS = {
    "a bad kv_role": {"kv_connector": "LMCacheMPConnector", "kv_role": "both"},
    "an unknown key": {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "no_such_key": 1,
    },
}


def stand_in(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []
    sys.modules[name] = module


def load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def one_function(path, name, namespace):
    """The top-level function `name` of the file at `path`, on its own."""
    text = open(path, encoding="utf-8").read()
    node = next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef) and n.name == name
    )
    exec(ast.get_source_segment(text, node), namespace)
    return namespace[name]


def vllm_parser(base):
    """vLLM's parse of --kv-transfer-config from the sources under `base`."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    stand_in("vllm")
    stand_in("vllm.config")
    stand_in("vllm.envs", is_set=lambda name: False)
    stand_in("vllm.logger", init_logger=logging.getLogger)
    stand_in("vllm.utils")
    stand_in("vllm.utils.hashing", safe_hash=hashlib.sha256)
    stand_in("vllm.platforms", current_platform=types.SimpleNamespace(device_type="cuda"))
    load_file("vllm.config.utils", f"{base}/vllm/config/utils.py")
    kv_transfer = load_file("vllm.config.kv_transfer", f"{base}/vllm/config/kv_transfer.py")

    def no_suffixed_numbers(text):
        raise ValueError(f"unexpected number with a suffix: {text!r}")

    expand = one_function(
        f"{base}/vllm/engine/arg_utils.py",
        "_expand_json_human_readable_numbers",
        {"re": re, "human_readable_int": no_suffixed_numbers},
    )
    from pydantic import TypeAdapter

    adapter = TypeAdapter(kv_transfer.KVTransferConfig)
    return lambda text: adapter.validate_json(expand(text))


def check(sources, version, config_text):
    base = f"{sources}/{version}"
    result = {"vllm": version}
    metadata = open(f"{base}/METADATA", encoding="utf-8").read()
    torch = re.search(r"^Requires-Dist: (torch==[^\s;]+)", metadata, re.M)
    result["torch"] = torch.group(1) if torch else None
    parse = vllm_parser(base)
    try:
        config = parse(config_text)
        result["accepted"] = True
        host = config.get_from_extra_config("lmcache.mp.host", None)
        port = config.get_from_extra_config("lmcache.mp.port", None)
        result["server_url"] = f"{host}:{port}"
    except Exception as e:  # what vLLM says when it refuses the config
        result["accepted"] = False
        result["error"] = " ".join(str(e).split())[:400]
    refused = []
    for name, control in CONTROLS.items():
        try:
            parse(json.dumps(control))
        except Exception:
            refused.append(name)
    result["controls_refused"] = refused
    factory = open(f"{base}/{CONNECTOR_DIR}/factory.py", encoding="utf-8").read()
    result["registered"] = bool(
        re.search(r'register_connector\(\s*"LMCacheMPConnector"', factory)
    )
    connector = open(
        f"{base}/{CONNECTOR_DIR}/v1/lmcache_mp_connector.py", encoding="utf-8"
    ).read()
    result["extra_config_keys"] = sorted(
        set(re.findall(r'get_from_extra_config\(\s*"([^"]+)"', connector))
    )
    result["names_kv_after_model"] = "model_name=vllm_config.model_config.model" in connector
    result["ok"] = (
        result["accepted"]
        and len(refused) == len(CONTROLS)
        and result["registered"]
        and {"lmcache.mp.host", "lmcache.mp.port"} <= set(result["extra_config_keys"])
        and result["names_kv_after_model"]
    )
    return result


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sources, versions = sys.argv[1], sys.argv[2:]
    config_text = sys.stdin.read()
    results = [check(sources, v, config_text) for v in versions]
    for result in results:
        print(json.dumps(result))
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
