# attack: a busy loop that never makes a system call
# expect: timeout
# limits: {"timeout_ms": 300}
# must not: run past its time limit or slow the other requests' VMs
while True:
    pass
