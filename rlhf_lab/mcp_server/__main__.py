"""`python -m rlhf_lab.mcp_server [--http ...]`: serve the lab's MCP server."""

import sys

from rlhf_lab.mcp_server import _cli

sys.exit(_cli())
