"""Prints the flags of the installed LMCache's `lmcache server` command as
JSON, the table the launcher reads EREBINE_AGENT_LMCACHE_EXTRA_ARGS with.

Run it with the Python of an LMCache environment and save the output as
launcher/src/node/lmcache-server-flags.json when LMCache is upgraded:

    ~/.cache/erebine/lmcache-0.5.6/bin/python scripts/lmcache-server-flags.py \
        > launcher/src/node/lmcache-server-flags.json
"""

import argparse
import importlib.metadata
import json

from lmcache.cli.commands import register_commands

TAKES = {None: "one", 0: "none", "?": "optional", "*": "any", "+": "some"}


def flag(action):
    return {
        "names": action.option_strings,
        "takes": TAKES[action.nargs],
        "type": getattr(action.type, "__name__", None),
        "choices": list(action.choices) if action.choices else None,
        "help": isinstance(action, argparse._HelpAction),
    }


def main():
    top = argparse.ArgumentParser(prog="lmcache")
    commands = top.add_subparsers(dest="command")
    register_commands(commands, ["server"])
    server = commands.choices["server"]
    table = {
        "lmcache": importlib.metadata.version("lmcache"),
        "allow_abbrev": server.allow_abbrev,
        "flags": sorted(
            (flag(a) for a in server._actions if a.option_strings),
            key=lambda f: f["names"],
        ),
    }
    if any(not a.option_strings for a in server._actions):
        raise SystemExit("lmcache server takes positional arguments: extend the table")
    print(json.dumps(table, indent=1))


main()
