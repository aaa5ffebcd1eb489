"""A second process using the package, for the tests that need two.

    holder.py ADDR append NAME FILE [aio]   takes the lock, appends "start PID", waits 0.3 s,
                                            appends "end PID", releases; 5 rounds
    holder.py ADDR hold NAME [aio]          takes the lock, prints HELD, and waits to be killed
    holder.py ADDR campaign NAME VALUE [aio]
                                            campaigns with VALUE, prints "LEADER TERM" once
                                            elected, and resigns when a line comes on stdin
"""

import asyncio
import os
import sys
import time

import baton
import baton.aio


def append_rounds(addr, name, path):
    with baton.Baton.connect(addr) as client:
        for _ in range(5):
            with client.lock(name, ttl=5):
                with open(path, "a") as f:
                    f.write(f"start {os.getpid()}\n")
                time.sleep(0.3)
                with open(path, "a") as f:
                    f.write(f"end {os.getpid()}\n")


async def append_rounds_aio(addr, name, path):
    async with baton.aio.Baton.connect(addr) as client:
        for _ in range(5):
            async with client.lock(name, ttl=5):
                with open(path, "a") as f:
                    f.write(f"start {os.getpid()}\n")
                await asyncio.sleep(0.3)
                with open(path, "a") as f:
                    f.write(f"end {os.getpid()}\n")


def hold(addr, name):
    client = baton.Baton.connect(addr)
    with client.lock(name, ttl=30) as lease:
        print(f"HELD {lease.fencing_token}", flush=True)
        time.sleep(600)


async def hold_aio(addr, name):
    client = baton.aio.Baton.connect(addr)
    async with client.lock(name, ttl=30) as lease:
        print(f"HELD {lease.fencing_token}", flush=True)
        await asyncio.sleep(600)


def campaign(addr, name, value):
    with baton.Baton.connect(addr) as client:
        with client.campaign(name, value=value, ttl=5) as leadership:
            print(f"LEADER {leadership.term}", flush=True)
            sys.stdin.readline()


async def campaign_aio(addr, name, value):
    async with baton.aio.Baton.connect(addr) as client:
        async with client.campaign(name, value=value, ttl=5) as leadership:
            print(f"LEADER {leadership.term}", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def main():
    addr, what, name = sys.argv[1:4]
    aio = sys.argv[-1] == "aio"
    if what == "campaign":
        value = sys.argv[4]
        if aio:
            asyncio.run(campaign_aio(addr, name, value))
        else:
            campaign(addr, name, value)
    elif what == "append":
        path = sys.argv[4]
        if aio:
            asyncio.run(append_rounds_aio(addr, name, path))
        else:
            append_rounds(addr, name, path)
    elif aio:
        asyncio.run(hold_aio(addr, name))
    else:
        hold(addr, name)


if __name__ == "__main__":
    main()
