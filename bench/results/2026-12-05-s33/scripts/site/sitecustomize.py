"""Put on PYTHONPATH by skeleton.py / gcwire.py: applies stubs.py's floors named in ABLATE to a `rampmeter serve`."""
import os
import sys

if os.environ.get("ABLATE"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import stubs

    stubs.apply(os.environ["ABLATE"].split())
