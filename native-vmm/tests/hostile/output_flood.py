# attack: write to stdout or stderr without end
# expect: output_limit
# variants: stdout stderr both
# must not: hold more than the output cap in the VMM or stall the daemon's other connections
import sys

line = b"flood " * 1000 + b"\n"
streams = {"stdout": [sys.stdout.buffer], "stderr": [sys.stderr.buffer], "both": [sys.stdout.buffer, sys.stderr.buffer]}[sys.argv[1]]
while True:
    for stream in streams:
        stream.write(line)
        stream.flush()
