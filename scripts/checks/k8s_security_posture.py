#!/usr/bin/env python3
"""Asserts the security posture and operability of sysscope's Kubernetes manifests.

Reads rendered manifests (`kubectl kustomize deploy/kubernetes`, multi-document YAML) or, with
--kustomization DIR, renders the resources a kustomization lists itself (when kubectl is not
installed). Fails on: a privileged container, privilege escalation, a writable root filesystem,
capabilities not dropped (ALL) or added beyond the allowed set (and every added capability
must be justified in docs/kubernetes.md), a seccomp profile other than RuntimeDefault/Localhost,
host mounts that are writable or not on the allowlist, host network/IPC, missing or malformed
resources, missing probes, a missing NODE_NAME, a loopback listen address, RBAC beyond
get/list/watch pods, a non-headless Service, a PodMonitor that does not select the pods.

  k8s_security_posture.py RENDERED.yaml [--docs docs/kubernetes.md]
  k8s_security_posture.py --kustomization deploy/kubernetes [--docs ...]
  k8s_security_posture.py --self-test RENDERED.yaml   (proves each check can fail)

Prints the problems (one a line) and a last line "OK: ..." or "FAIL: ..."; exit status 1 on
failure.
"""

import argparse
import copy
import os
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit("FAIL: PyYAML is needed (apt-get install python3-yaml, or pip install pyyaml)")

ALLOWED_CAPABILITIES = {"BPF", "PERFMON"}
# Host paths sysscope may mount, all read-only.
ALLOWED_HOST_PATHS = {"/sys/fs/cgroup", "/sys/kernel/btf", "/sys/kernel/tracing", "/proc"}
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}

_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SCALE = {
    None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def quantity(value):
    """A Kubernetes quantity as a number, or None if it is not one."""
    m = _QUANTITY.match(str(value))
    if not m:
        return None
    return float(m.group(1)) * _SCALE[m.group(3)]


def load_rendered(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def render_kustomization(directory):
    """The resources a kustomization lists, with its namespace and generated ConfigMaps (no
    hash suffix): enough for these checks where kubectl is not installed."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    docs = []
    for res in k.get("resources", []):
        docs.extend(load_rendered(os.path.join(directory, res)))
    for gen in k.get("configMapGenerator", []):
        data = {}
        for fname in gen.get("files", []):
            with open(os.path.join(directory, fname)) as f:
                data[os.path.basename(fname)] = f.read()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"]}, "data": data})
    ns = k.get("namespace")
    if ns:
        for d in docs:
            if d.get("kind") not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"):
                d.setdefault("metadata", {})["namespace"] = ns
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def check(docs, documented_caps):
    problems = []
    p = problems.append

    daemonsets = by_kind(docs, "DaemonSet")
    if len(daemonsets) != 1:
        p(f"expected exactly one DaemonSet, found {len(daemonsets)}")
        return problems
    ds = daemonsets[0]
    pod_labels = ds["spec"]["template"]["metadata"].get("labels", {})
    spec = ds["spec"]["template"]["spec"]

    for key in ("hostNetwork", "hostIPC"):
        if spec.get(key):
            p(f"DaemonSet: {key}: true is not needed and not allowed")
    if spec.get("hostPID") is not True:
        p("DaemonSet: hostPID: true is required (the kernel reports host pids)")
    if not any(t.get("operator") == "Exists" and not t.get("key") for t in spec.get("tolerations", [])):
        p("DaemonSet: needs a toleration {operator: Exists} to run on every node")
    pod_sc = spec.get("securityContext", {}) or {}
    if pod_sc.get("seccompProfile", {}).get("type") == "Unconfined":
        p("DaemonSet: pod seccompProfile Unconfined")

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for name, v in volumes.items():
        if "hostPath" in v:
            path = v["hostPath"]["path"].rstrip("/") or "/"
            if path not in ALLOWED_HOST_PATHS:
                p(f"volume {name}: hostPath {path} is not on the allowlist {sorted(ALLOWED_HOST_PATHS)}")
        cm = v.get("configMap")
        if cm and not any(c["metadata"]["name"] == cm["name"] for c in by_kind(docs, "ConfigMap")):
            p(f"volume {name}: ConfigMap {cm['name']} is not among the manifests")

    containers = spec.get("containers", []) + spec.get("initContainers", [])
    ports = set()
    for c in containers:
        name = c.get("name", "?")
        sc = c.get("securityContext") or {}
        if sc.get("privileged") is True:
            p(f"container {name}: privileged: true")
        if sc.get("allowPrivilegeEscalation") is not False:
            p(f"container {name}: allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            p(f"container {name}: readOnlyRootFilesystem must be true")
        caps = sc.get("capabilities") or {}
        drop = {x.upper().removeprefix("CAP_") for x in caps.get("drop", [])}
        if "ALL" not in drop:
            p(f"container {name}: capabilities.drop must contain ALL")
        for cap in caps.get("add", []):
            bare = cap.upper().removeprefix("CAP_")
            if bare not in ALLOWED_CAPABILITIES:
                p(f"container {name}: unexpected capability {cap} (allowed: {sorted(ALLOWED_CAPABILITIES)})")
            elif documented_caps is not None and bare not in documented_caps:
                p(f"container {name}: capability {cap} is not justified in docs/kubernetes.md")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ALLOWED_SECCOMP:
            p(f"container {name}: seccompProfile must be one of {sorted(ALLOWED_SECCOMP)}, got {seccomp}")

        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:
                p(f"container {name}: mount {m['name']} has no volume")
            elif "hostPath" in v and m.get("readOnly") is not True:
                p(f"container {name}: host mount {m['name']} ({v['hostPath']['path']}) must be readOnly")

        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for where, table, key in (("requests", req, "cpu"), ("requests", req, "memory"), ("limits", lim, "memory")):
            if key not in table:
                p(f"container {name}: resources.{where}.{key} missing")
            elif quantity(table[key]) is None or quantity(table[key]) <= 0:
                p(f"container {name}: resources.{where}.{key} {table[key]!r} is not a positive quantity")
        if quantity(req.get("memory")) and quantity(lim.get("memory")) and quantity(lim["memory"]) < quantity(req["memory"]):
            p(f"container {name}: memory limit below its request")

        if c in spec.get("containers", []):
            for probe, path in (("livenessProbe", "/-/healthy"), ("readinessProbe", "/-/ready")):
                got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
                if got != path:
                    p(f"container {name}: {probe} must GET {path}, got {got}")
            env = {e["name"]: e for e in c.get("env", [])}
            field = (((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if field != "spec.nodeName":
                p(f"container {name}: NODE_NAME must come from the downward API (fieldRef spec.nodeName)")
            args = c.get("args", []) + c.get("command", [])
            listen = [a for a in args if a.startswith("--web.listen-address=")]
            if not listen or listen[-1].split("=", 1)[1].startswith(("127.", "localhost", "[::1]")):
                p(f"container {name}: --web.listen-address must be set explicitly to a non-loopback address")
            ports |= {pt.get("name") for pt in c.get("ports", [])}

    roles = by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
    for r in roles:
        for rule in r.get("rules", []):
            if set(rule.get("apiGroups", [])) != {""} or set(rule.get("resources", [])) != {"pods"} \
                    or not set(rule.get("verbs", [])) <= {"get", "list", "watch"}:
                p(f"{r['kind']} {r['metadata']['name']}: only get/list/watch on pods is allowed, got {rule}")
    if not roles:
        p("no ClusterRole for the pod watch")

    for svc in by_kind(docs, "Service"):
        if svc["spec"].get("clusterIP") != "None":
            p(f"Service {svc['metadata']['name']}: must be headless (clusterIP: None)")
        sel = svc["spec"].get("selector", {})
        if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
            p(f"Service {svc['metadata']['name']}: selector {sel} does not select the DaemonSet's pods")

    for pm in by_kind(docs, "PodMonitor"):
        sel = pm["spec"].get("selector", {}).get("matchLabels", {})
        if not sel or any(pod_labels.get(k) != v for k, v in sel.items()):
            p(f"PodMonitor {pm['metadata']['name']}: selector {sel} does not select the DaemonSet's pods")
        for ep in pm["spec"].get("podMetricsEndpoints", []):
            if ep.get("port") not in ports:
                p(f"PodMonitor {pm['metadata']['name']}: port {ep.get('port')} is not a container port")
            for rl in ep.get("relabelings", []):
                if rl.get("action", "replace") not in ("replace", "keep", "drop", "labeldrop", "labelkeep",
                                                      "labelmap", "hashmod", "lowercase", "uppercase"):
                    p(f"PodMonitor {pm['metadata']['name']}: unknown relabel action {rl.get('action')}")
    return problems


def documented_capabilities(doc_path):
    """Capabilities the docs justify: `CAP_X` names in the capability table's first column."""
    if not doc_path or not os.path.exists(doc_path):
        return None
    text = open(doc_path).read()
    return {m.group(1) for m in re.finditer(r"^\|\s*`CAP_([A-Z_]+)`", text, re.M)}


def self_test(docs, documented_caps):
    """Each mutation of the (passing) manifests must be caught."""
    def ds_container(d):
        return by_kind(d, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]

    def mutate(fn):
        d = copy.deepcopy(docs)
        fn(d)
        return d

    mutations = {
        "privileged": lambda d: ds_container(d)["securityContext"].__setitem__("privileged", True),
        "no drop ALL": lambda d: ds_container(d)["securityContext"]["capabilities"].__setitem__("drop", []),
        "SYS_ADMIN added": lambda d: ds_container(d)["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
        "writable host mount": lambda d: [m.__setitem__("readOnly", False) for m in ds_container(d)["volumeMounts"]],
        "host root mounted": lambda d: by_kind(d, "DaemonSet")[0]["spec"]["template"]["spec"]["volumes"].append(
            {"name": "root", "hostPath": {"path": "/"}}),
        "no resources": lambda d: ds_container(d).pop("resources"),
        "bad quantity": lambda d: ds_container(d)["resources"]["requests"].__setitem__("memory", "lots"),
        "writable root fs": lambda d: ds_container(d)["securityContext"].__setitem__("readOnlyRootFilesystem", False),
        "unconfined seccomp": lambda d: ds_container(d)["securityContext"].__setitem__(
            "seccompProfile", {"type": "Unconfined"}),
        "no liveness probe": lambda d: ds_container(d).pop("livenessProbe"),
        "loopback listen": lambda d: ds_container(d).__setitem__("args", ["--web.listen-address=127.0.0.1:9812"]),
        "secrets readable": lambda d: by_kind(d, "ClusterRole")[0]["rules"].append(
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
        "hostNetwork": lambda d: by_kind(d, "DaemonSet")[0]["spec"]["template"]["spec"].__setitem__(
            "hostNetwork", True),
    }
    missed = []
    for what, fn in mutations.items():
        if not check(mutate(fn), documented_caps):
            missed.append(what)
    return missed, len(mutations)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rendered", nargs="?")
    ap.add_argument("--kustomization")
    ap.add_argument("--docs", default=None)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.kustomization:
        docs = render_kustomization(args.kustomization)
    elif args.rendered:
        docs = load_rendered(args.rendered)
    else:
        ap.error("give RENDERED.yaml or --kustomization DIR")
    caps = documented_capabilities(args.docs)
    if args.docs and caps is None:
        print(f"FAIL: {args.docs} not found")
        return 1
    problems = check(docs, caps)
    for pr in problems:
        print(pr)
    if problems:
        print(f"FAIL: {len(problems)} security/operability problem(s) in the manifests")
        return 1
    if args.self_test:
        missed, total = self_test(docs, caps)
        for m in missed:
            print(f"self-test: the mutation '{m}' was not caught")
        if missed:
            print(f"FAIL: {len(missed)} of {total} bad mutations went unnoticed")
            return 1
        print(f"OK: posture holds (caps {sorted(ALLOWED_CAPABILITIES)}, read-only host mounts, resources, probes); "
              f"{total} bad mutations all caught")
        return 0
    print("OK: posture holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
