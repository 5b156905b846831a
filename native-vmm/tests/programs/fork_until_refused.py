# Forks until a fork is refused and prints how many children it made and why it stopped
# (EAGAIN: the sandbox's process limit; ENOMEM: its memory); each child sleeps until the run
# ends.
import errno
import os
import time

children = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print(children, errno.errorcode[e.errno])
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children += 1
