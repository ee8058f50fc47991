"""The lab as an MCP server ("rlhf-lab"): thin adapters over :mod:`rlhf_lab.api`.

Every tool takes typed arguments (each with a description), returns a pydantic model (sent as
structured content with its output schema) and answers within seconds: ``launch_run`` starts the
trainer detached and returns its run id at once, ``tail_logs`` is capped and returns a cursor,
``get_metrics`` is down-sampled. Each tool adapts one function of :mod:`rlhf_lab.api`
(:data:`TOOL_OPERATIONS`); this module imports nothing else of the lab but :mod:`rlhf_lab.errors`.
Expected failures (:class:`~rlhf_lab.errors.LabError`: unknown recipe, run not found, invalid
config, busy device) come back as the SDK's ``ToolError``: the lab's message, then its next steps
rendered as tool calls (``launch_run(queue=true)``, :func:`render_step`), or the tool's own
default hint when the error names none; no traceback reaches the client. "No GPU" is an answer of
``check_resources``, not an error.

Resources: ``ledger://index`` (experiments/README.md, or a generated index when there is none)
and ``ledger://{campaign}`` (a campaign's markdown). Prompts: ``sanity_check`` and
``compare_algorithms``.

Transports: stdio (default; what ``.mcp.json`` starts with ``uv run rlhf-lab mcp``) or streamable
HTTP on 127.0.0.1 (``--http``); a non-loopback host needs ``--allow-remote``. Logging goes to
stderr only. Nothing here writes to stdout: in stdio mode stdout is the protocol channel, and the
trainers run as detached processes whose stdout and stderr go to their own ``train.log``.

Torch-free: importing this module (and serving) never imports torch or transformers.
"""

import argparse
import ipaddress
import logging
import sys

from rlhf_lab.errors import InvalidArgument, LabError
from rlhf_lab.mcp_server import content, tools  # noqa: F401  (registers resources, prompts)
from rlhf_lab.mcp_server._core import (
    DEFAULT_PORT,
    MCP_OPERATIONS,
    MCP_RESOURCE_OPERATIONS,
    SERVER_NAME,
    render_error,
    render_step,
    server,
)
from rlhf_lab.mcp_server.tools import TOOL_NAMES, TOOL_OPERATIONS

__all__ = [
    "DEFAULT_PORT",
    "MCP_OPERATIONS",
    "MCP_RESOURCE_OPERATIONS",
    "SERVER_NAME",
    "TOOL_NAMES",
    "TOOL_OPERATIONS",
    "check_bind_host",
    "main",
    "render_error",
    "render_step",
    "server",
]

log = logging.getLogger("rlhf_lab.mcp")


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def check_bind_host(host: str, allow_remote: bool = False) -> str:
    """Return ``host`` if serving HTTP on it is allowed: loopback always, anything else only
    with ``allow_remote``. Raises InvalidArgument otherwise (the serving flags are the CLI's
    ``rlhf-lab mcp`` options, so its message names them)."""
    name = (host or "").strip()
    if not name:
        raise InvalidArgument("--host is empty; use 127.0.0.1")
    loopback = name == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(name.strip("[]")).is_loopback
        except ValueError:
            loopback = False
    if not loopback and not allow_remote:
        raise InvalidArgument(
            f"refusing to serve on {name!r}: the lab server can launch and stop training jobs, "
            "so it only listens on loopback (127.0.0.1, ::1, localhost) by default. Pass "
            "--allow-remote to expose it anyway (no authentication; use a trusted network or "
            "an SSH tunnel instead)"
        )
    return name


def _configure_logging() -> None:
    """Everything the lab logs goes to stderr (stdout is the protocol channel in stdio mode)."""
    root = logging.getLogger()
    for handler in root.handlers:
        stream = getattr(handler, "stream", None)
        if stream is sys.stdout:  # pragma: no cover - the SDK's handler already uses stderr
            handler.setStream(sys.stderr)
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("rlhf_lab").setLevel(logging.INFO)


def _serve_http(host: str, port: int) -> None:
    """Streamable HTTP at http://<host>:<port>/mcp. Like ``server.run("streamable-http")``, but
    uvicorn's access log goes to stderr too (its default is stdout)."""
    import copy

    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    log_config = copy.deepcopy(LOGGING_CONFIG)
    for handler in log_config["handlers"].values():
        handler["stream"] = "ext://sys.stderr"
    bind = host.strip("[]")
    app = server.streamable_http_app(host=bind)  # DNS-rebinding protection on loopback hosts
    log.info("rlhf-lab MCP server on http://%s:%s/mcp", host, port)
    uvicorn.run(app, host=bind, port=port, log_level="info", log_config=log_config)


def main(
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    allow_remote: bool = False,
) -> None:
    """Serve over stdio (default) or streamable HTTP at http://<host>:<port>/mcp."""
    _configure_logging()
    if http:
        host = check_bind_host(host, allow_remote)  # the checked, stripped name is served
        if not 0 < port < 65536:
            raise InvalidArgument(f"bad --port {port}: use 1-65535")
        if allow_remote:
            log.warning("serving rlhf-lab on %s:%s without authentication", host, port)
        _serve_http(host, port)
    else:
        server.run()


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.mcp_server", description=main.__doc__)
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--allow-remote", action="store_true")
    args = parser.parse_args(argv)
    try:
        main(http=args.http, host=args.host, port=args.port, allow_remote=args.allow_remote)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
