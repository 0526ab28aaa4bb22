"""Prints the file names LMCache's own code gives the objects of a vLLM engine.

Reads engine configurations, a JSON list, on stdin; each is an object with
`model` (vLLM's --model), `tensor_parallel_size`, `pipeline_parallel_size`,
`decode_context_parallel_size`, `cp_kv_cache_interleave_size`, `mla` and
`hybrid` (the model's attention kind), `chunk_size` and `cache_salts` (a list;
"" is no salt). For each it prints one JSON line: the case and `names`, the
`fs`/`fs_native` file names of two chunks of every rank that writes, in object
groups 0 and 1.

Every step is LMCache's own function from the installed package (0.5.6):
the vLLM connector's `get_dcp_decorated_model_name` and
`build_parallel_strategy_from_vllm_config`, `ParallelStrategy`'s
`is_kv_writer`, `kv_world_size` and `kv_worker_id`, the server's
`TokenHasher`, `ipc_key_to_object_keys` and the fs adapter's
`_object_key_to_filename`. The connector module imports vLLM, which the CPU
test environment does not have: an import hook makes every `vllm` module an
empty stand-in, so the imports succeed; none of the functions called here
reaches into vLLM. The configurations are plain attribute objects with the
fields those functions read (`model_config.model`, `use_mla`, `is_hybrid`,
`parallel_config.*`).

Usage: python lmcache-object-names.py < cases.json
"""

import importlib.abc
import importlib.machinery
import json
import sys
import types


class _StandIn(type):
    """A class whose every attribute is another stand-in class."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StandIn(attr, (), {})

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __hash__(cls):
        return id(cls)


class _VllmStandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `import vllm...` succeed with empty modules."""

    def find_spec(self, name, path, target=None):
        if name == "vllm" or name.startswith("vllm."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: _StandIn(attr, (), {})
        return module

    def exec_module(self, module):
        pass


def names_of(case, connector, api, fs_adapter, hasher_class, key_class):
    tp, pp = case["tensor_parallel_size"], case["pipeline_parallel_size"]
    model_config = types.SimpleNamespace(
        model=case["model"], use_mla=case["mla"], is_hybrid=case["hybrid"]
    )
    parallel = types.SimpleNamespace(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        world_size=tp * pp,
        rank=0,
        decode_context_parallel_size=case["decode_context_parallel_size"],
        cp_kv_cache_interleave_size=case["cp_kv_cache_interleave_size"],
    )
    config = types.SimpleNamespace(model_config=model_config, parallel_config=parallel)
    model_name = connector.get_dcp_decorated_model_name(config, None)
    tokens = list(range(1000, 1000 + 2 * case["chunk_size"]))
    hashes = hasher_class(chunk_size=case["chunk_size"]).compute_chunk_hashes(tokens)
    names = []
    for rank in range(tp * pp):
        parallel.rank = rank
        strategy = connector.build_parallel_strategy_from_vllm_config(config, 1)
        if not strategy.is_kv_writer:
            continue
        for salt in case["cache_salts"]:
            key = key_class(
                model_name=model_name,
                world_size=strategy.kv_world_size,
                worker_id=strategy.kv_worker_id,
                token_ids=tuple(tokens),
                start=0,
                end=len(tokens),
                request_id="r",
                cache_salt=salt,
            )
            for group in api.ipc_key_to_object_keys(key, hashes, [0, 1]):
                names.extend(fs_adapter._object_key_to_filename(k) for k in group)
    return names


def main():
    sys.meta_path.insert(0, _VllmStandIns())
    from lmcache.integration.vllm import lmcache_mp_connector as connector
    from lmcache.v1.distributed import api
    from lmcache.v1.distributed.l2_adapters import fs_l2_adapter as fs_adapter
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
    from lmcache.v1.multiprocess.token_hasher import TokenHasher

    for case in json.load(sys.stdin):
        names = names_of(case, connector, api, fs_adapter, TokenHasher, IPCCacheServerKey)
        print(json.dumps({"case": case, "names": names}), flush=True)


if __name__ == "__main__":
    main()
