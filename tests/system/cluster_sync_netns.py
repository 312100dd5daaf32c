#!/usr/bin/python3
"""cluster_sync.py across network namespaces: each dted in its own netns,
joined by veths into a bridge in a hub namespace (UCX_TLS=tcp,
UCX_NET_DEVICES=<veth>), created and removed by the test, fewer versions.
Final line: `cluster-sync-netns: versions=N exact=N/N`."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
os.execv(sys.executable, [sys.executable, os.path.join(HERE, "cluster_sync.py"), "--netns"])
