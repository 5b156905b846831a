# attack: a Python list that grows without end
# expect: out_of_memory
# limits: {"timeout_ms": 60000}
# must not: take host memory beyond the request's memory limit
chunks = []
while True:
    chunks.append(bytearray(1 << 20))
