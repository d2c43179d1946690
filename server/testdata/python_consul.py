"""Drives a Lodestone cluster with Debian's python3-consul (python-consul
0.7): KV, sessions and locks, catalog registration and health. Usage:
python3 python_consul.py HOST PORT. Prints one line per observation; the
Go test (consul_python_test.go) compares them with what Consul answers.
Any failed request raises, and the exit code is not 0."""

import sys

import consul

host, port = sys.argv[1], int(sys.argv[2])
c = consul.Consul(host=host, port=port)


def show(*words):
    print(" ".join(str(w) for w in words), flush=True)


# KV: put, get, recurse, keys, cas, delete.
show("put a/x", c.kv.put("py/a/x", "1"))
show("put a/y", c.kv.put("py/a/y", b"2", flags=7))
_, x = c.kv.get("py/a/x")
show("get a/x", x["Value"].decode(), x["Flags"], x["ModifyIndex"] > 0)
_, y = c.kv.get("py/a/y")
show("get a/y flags", y["Flags"])
_, entries = c.kv.get("py/a/", recurse=True)
show("recurse", [e["Key"] for e in entries])
_, keys = c.kv.get("py/", keys=True, separator="/")
show("keys", keys)
show("cas on a stale index", c.kv.put("py/a/x", "3", cas=x["ModifyIndex"] + 1000))
show("cas on the current index", c.kv.put("py/a/x", "3", cas=x["ModifyIndex"]))
show("delete a/x", c.kv.delete("py/a/x"))
_, gone = c.kv.get("py/a/x")
show("get deleted", gone)
show("delete recurse", c.kv.delete("py/", recurse=True))
_, none = c.kv.get("py/", recurse=True)
show("recurse after delete", none)

# Sessions and locks: acquire, contend, release, hand over, destroy.
s1 = c.session.create(name="py-one", ttl=10, lock_delay=0)
s2 = c.session.create(name="py-two", behavior="delete", lock_delay=0)
show("sessions created", len(s1) == 36, len(s2) == 36, s1 != s2)
show("s1 acquires", c.kv.put("py/lock", "one", acquire=s1))
show("s2 acquires a held lock", c.kv.put("py/lock", "two", acquire=s2))
_, lock = c.kv.get("py/lock")
show("lock holder is s1", lock.get("Session") == s1, lock["Value"].decode(), lock["LockIndex"])
show("s1 releases", c.kv.put("py/lock", "free", release=s1))
show("s2 acquires", c.kv.put("py/lock", "two", acquire=s2))
_, lock = c.kv.get("py/lock")
show("lock holder is s2", lock.get("Session") == s2, lock["LockIndex"])
_, info = c.session.info(s1)
show("s1 info", info["Name"], info["TTL"], info["Behavior"])
_, listed = c.session.list()
show("sessions listed", sorted(s["Name"] for s in listed if s["ID"] in (s1, s2)))
renewed = c.session.renew(s1)
show("s1 renewed", renewed["ID"] == s1)
show("destroy s2", c.session.destroy(s2))
_, after = c.kv.get("py/lock")
show("delete-behavior lock after destroy", after)
show("destroy s1", c.session.destroy(s1))
_, info = c.session.info(s1)
show("s1 info after destroy", info)

# Catalog registration and health.
show("register web-1", c.catalog.register(
    "py-node", "10.1.0.1",
    service={"Service": "pyweb", "ID": "pyweb-1", "Tags": ["v1"], "Port": 8080},
    check={"CheckID": "pyweb-1-alive", "Name": "alive", "Status": "passing", "ServiceID": "pyweb-1"}))
_, services = c.catalog.services()
show("catalog services", services.get("pyweb"))
_, nodes = c.catalog.service("pyweb")
show("catalog service", [(n["Node"], n["ServiceID"], n["ServicePort"], n["Address"]) for n in nodes])
_, passing = c.health.service("pyweb", passing=True)
show("passing instances", [e["Service"]["ID"] for e in passing])
show("check goes critical", c.catalog.register(
    "py-node", "10.1.0.1",
    check={"CheckID": "pyweb-1-alive", "Name": "alive", "Status": "critical", "ServiceID": "pyweb-1"}))
_, passing = c.health.service("pyweb", passing=True)
show("passing instances", [e["Service"]["ID"] for e in passing])
_, checks = c.health.checks("pyweb")
show("checks of pyweb", [(ch["CheckID"], ch["Status"]) for ch in checks])
_, critical = c.health.state("critical")
show("critical checks", [ch["CheckID"] for ch in critical if ch["Node"] == "py-node"])
_, node_checks = c.health.node("py-node")
show("node checks", [ch["CheckID"] for ch in node_checks])
show("deregister node", c.catalog.deregister("py-node"))
_, nodes = c.catalog.nodes()
show("py-node listed", any(n["Node"] == "py-node" for n in nodes))
show("leader known", c.status.leader() != "")
