#!/usr/bin/env python3
"""Asserts the security posture and operability of sysscope's Kubernetes manifests.

Reads rendered manifests (`kubectl kustomize deploy/kubernetes`, multi-document YAML) or, with
--kustomization DIR, renders the kustomization itself (when kubectl is not installed): its
resources (files and kustomization directories), ConfigMap generators, namespace, components,
JSON 6902 and strategic-merge patches and replacements, the subset of kustomize these
manifests use. Fails on: a
privileged container, privilege escalation, a writable root filesystem,
capabilities not dropped (ALL) or added beyond the allowed set (and every added capability
must be justified in docs/kubernetes.md), a seccomp profile other than RuntimeDefault/Localhost,
host mounts that are writable or not on the allowlist, host network/IPC, missing or malformed
resources, missing probes, a missing NODE_NAME, a loopback or single-family listen address, a mounted
config.toml that is not TOML or turns slow-call file paths off (the kernel names files with
BPF and PERFMON alone: an added DAC_READ_SEARCH or SYS_PTRACE only serves the /proc fallback,
which is opt-in), RBAC beyond get/list/watch pods, a non-headless Service, a PodMonitor that does not select the pods, a
DaemonSet whose selector matches another DaemonSet's pods. With the GPU DaemonSet
(components/gpu-operator, components/gpu-host-driver) also on: a pod that requests an
nvidia.com resource (the agent must not take a GPU from the scheduler), a RuntimeClass or
NVIDIA variables on a DaemonSet that does not select GPU nodes only, a node both DaemonSets
could run on, a host path outside the allowlist other than one libnvidia-ml.so.1 file
(hostPath type File, mounted as that file: never its directory, never through subPath, which
makes the kubelet create a directory on the host where the file is missing), and any
difference between the two DaemonSets beyond the GPU ones.

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
try:
    import tomllib
except ImportError:
    try:
        import tomli as tomllib
    except ImportError:
        sys.exit("FAIL: Python 3.11 (tomllib) or tomli is needed to read config.toml")

ALLOWED_CAPABILITIES = {"BPF", "PERFMON"}
# Optional capabilities of the /proc fallback of slow-call file names (docs/kubernetes.md,
# "Opting in to the /proc fallback"): refused like any other, with a pointer to that section.
PROC_FALLBACK_CAPABILITIES = {"DAC_READ_SEARCH", "SYS_PTRACE"}
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


def _pointer(doc, path):
    """The parent container and last key of a JSON pointer (RFC 6901) into doc."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    cur = doc
    for part in parts[:-1]:
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    return cur, parts[-1]


def apply_json6902(doc, ops):
    for op in ops:
        parent, key = _pointer(doc, op["path"])
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if key == "-" else int(key)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise ValueError(f"JSON patch op {kind} is not supported here")
        elif kind in ("add", "replace"):
            parent[key] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[key]
        else:
            raise ValueError(f"JSON patch op {kind} is not supported here")


def _field(doc, path, create=False):
    """The parent mapping and key of a kustomize fieldPath (dot-separated) in doc."""
    parts = path.split(".")
    cur = doc
    for part in parts[:-1]:
        if part not in cur:
            if not create:
                raise KeyError(path)
            cur[part] = {}
        cur = cur[part]
    return cur, parts[-1]


def apply_replacement(docs, repl):
    """A kustomize replacement: a source field (by kind and name) copied into the targets'."""
    src = repl["source"]
    source = [d for d in docs if _targets(d, src)]
    if len(source) != 1:
        raise ValueError(f"replacement source {src} matches {len(source)} objects")
    parent, key = _field(source[0], src["fieldPath"])
    value = parent[key]
    for target in repl["targets"]:
        create = (target.get("options") or {}).get("create", False)
        hits = [d for d in docs if _targets(d, target["select"])]
        if not hits:
            raise ValueError(f"replacement target {target['select']} matches nothing")
        for d in hits:
            for path in target["fieldPaths"]:
                tparent, tkey = _field(d, path, create)
                tparent[tkey] = copy.deepcopy(value)


def _merge(doc, patch):
    """A strategic-merge patch, for what these manifests use: maps merged key by key, lists of
    named maps (containers, volumes, env) merged by name, other lists replaced."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            _merge(doc[k], v)
        elif (isinstance(v, list) and isinstance(doc.get(k), list)
              and all(isinstance(x, dict) and "name" in x for x in v + doc[k])):
            for item in v:
                same = [x for x in doc[k] if x["name"] == item["name"]]
                if same:
                    _merge(same[0], item)
                else:
                    doc[k].append(copy.deepcopy(item))
        else:
            doc[k] = copy.deepcopy(v)


def _targets(doc, target):
    if target.get("kind") and doc.get("kind") != target["kind"]:
        return False
    if target.get("group") and not doc.get("apiVersion", "").startswith(target["group"] + "/"):
        return False
    meta = doc.get("metadata", {})
    if target.get("name") and meta.get("name") != target["name"]:
        return False
    for sel in filter(None, (target.get("labelSelector") or "").split(",")):
        k, v = sel.split("=", 1)
        if (meta.get("labels") or {}).get(k) != v:
            return False
    return True


def _apply_kustomization(directory, k, docs):
    """Adds a kustomization's (or component's) resources, components and patches to docs."""
    for res in k.get("resources", []):
        path = os.path.join(directory, res)
        docs.extend(render_kustomization(path) if os.path.isdir(path) else load_rendered(path))
    for gen in k.get("configMapGenerator", []):
        data = {}
        for fname in gen.get("files", []):
            with open(os.path.join(directory, fname)) as f:
                data[os.path.basename(fname)] = f.read()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"]}, "data": data})
    for comp in k.get("components", []):
        cdir = os.path.join(directory, comp)
        with open(os.path.join(cdir, "kustomization.yaml")) as f:
            _apply_kustomization(cdir, yaml.safe_load(f), docs)
    for patch in k.get("patches", []):
        ops = yaml.safe_load(patch["patch"])
        if isinstance(ops, dict) and ops.get("$patch") == "delete":
            # A strategic-merge patch that deletes the object it names.
            gone = [d for d in docs if d.get("kind") == ops.get("kind")
                    and d.get("metadata", {}).get("name") == ops.get("metadata", {}).get("name")]
            if not gone:
                raise ValueError(f"{directory}: delete patch of {ops.get('kind')} matches nothing")
            docs[:] = [d for d in docs if not any(d is g for g in gone)]
            continue
        hits = [d for d in docs if _targets(d, patch.get("target", {}))]
        if not hits:
            raise ValueError(f"{directory}: patch target {patch.get('target')} matches nothing")
        for d in hits:
            if isinstance(ops, dict):
                _merge(d, {k: v for k, v in ops.items() if k not in ("apiVersion", "kind", "metadata")})
            else:
                apply_json6902(d, ops)
    # kustomize runs replacements after patches.
    for repl in k.get("replacements", []):
        apply_replacement(docs, repl)


def render_kustomization(directory):
    """The objects a kustomization renders to, for the features these manifests use (no hash
    suffix on generated ConfigMaps): enough for these checks where kubectl is not installed."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    docs = []
    _apply_kustomization(directory, k, docs)
    ns = k.get("namespace")
    if ns:
        for d in docs:
            if d.get("kind") not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"):
                d.setdefault("metadata", {})["namespace"] = ns
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


# The GPU DaemonSet's own settings: what may differ from the plain agent's, and only there.
GPU_DAEMONSET = "sysscope-gpu"
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "LD_LIBRARY_PATH"}
NVML_FILE = "libnvidia-ml.so.1"
# The GPU Operator's validation markers (components/gpu-operator waits for toolkit-ready in
# an init container of that name), mounted read-only on the GPU DaemonSet only.
GPU_HOST_DIRS = {"/run/nvidia/validations"}
TOOLKIT_WAIT = "toolkit-validation"


def node_selector(spec):
    return {k: v for k, v in (spec.get("nodeSelector") or {}).items() if k != "kubernetes.io/os"}


def excluded(spec, key, value):
    """Whether the pod spec's required node affinity keeps it off nodes labelled key=value."""
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if not terms:
        return False
    for term in terms:
        ok = False
        for e in term.get("matchExpressions", []):
            if e.get("key") != key:
                continue
            if e.get("operator") == "NotIn" and value in e.get("values", []):
                ok = True
            if e.get("operator") == "DoesNotExist":
                ok = True
        if not ok:
            return False
    return True


def without_gpu_settings(ds):
    """A DaemonSet's pod template with everything the GPU DaemonSet may add or change removed."""
    t = copy.deepcopy(ds["spec"]["template"])
    t["metadata"].get("labels", {}).pop("app.kubernetes.io/component", None)
    spec = t["spec"]
    spec.pop("runtimeClassName", None)
    spec.pop("affinity", None)
    spec["nodeSelector"] = {k: v for k, v in (spec.get("nodeSelector") or {}).items()
                            if k == "kubernetes.io/os"}
    nvml_volumes = {v["name"] for v in spec.get("volumes", [])
                    if "hostPath" in v and v["hostPath"]["path"].rstrip("/") not in ALLOWED_HOST_PATHS}
    spec["initContainers"] = [c for c in spec.get("initContainers", []) if c.get("name") != TOOLKIT_WAIT]
    if not spec["initContainers"]:
        del spec["initContainers"]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in nvml_volumes]
    for c in spec.get("containers", []):
        c["env"] = [e for e in c.get("env", []) if e["name"] not in GPU_ENV]
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] not in nvml_volumes]
    return t


def config_problems(text):
    """What the DaemonSet's config.toml gets wrong."""
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return [f"not TOML: {e}"]
    slow = config.get("slow_calls", {})
    if slow.get("resolve_file_paths", True) is not True:
        return ["slow_calls.resolve_file_paths must stay on: the kernel names slow calls' files with "
                "CAP_BPF and CAP_PERFMON alone (leaving paths out for privacy belongs in an overlay)"]
    return []


def check_daemonset(ds, docs, documented_caps, p):
    """Problems of one DaemonSet; returns its pod labels and container port names."""
    name = ds["metadata"]["name"]
    pod_labels = ds["spec"]["template"]["metadata"].get("labels", {})
    spec = ds["spec"]["template"]["spec"]

    for key in ("hostNetwork", "hostIPC"):
        if spec.get(key):
            p(f"DaemonSet {name}: {key}: true is not needed and not allowed")
    if spec.get("hostPID") is not True:
        p(f"DaemonSet {name}: hostPID: true is required (the kernel reports host pids)")
    if not any(t.get("operator") == "Exists" and not t.get("key") for t in spec.get("tolerations", [])):
        p(f"DaemonSet {name}: needs a toleration {{operator: Exists}} to run on every node")
    pod_sc = spec.get("securityContext", {}) or {}
    if pod_sc.get("seccompProfile", {}).get("type") == "Unconfined":
        p(f"DaemonSet {name}: pod seccompProfile Unconfined")
    selects = ds["spec"].get("selector", {}).get("matchLabels", {})
    if not selects or any(pod_labels.get(k) != v for k, v in selects.items()):
        p(f"DaemonSet {name}: selector {selects} does not select its own pods")
    gpu_only = bool(node_selector(spec))
    nvidia_env = {e["name"] for c in spec.get("containers", []) for e in c.get("env", [])} & GPU_ENV
    if (spec.get("runtimeClassName") or nvidia_env) and not gpu_only:
        p(f"DaemonSet {name}: a RuntimeClass or NVIDIA variables only on a DaemonSet that selects GPU nodes "
          "(a RuntimeClass a node lacks makes its pod unschedulable)")

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    mounts = [(c.get("name", "?"), m) for c in containers for m in c.get("volumeMounts", [])]
    for vname, v in volumes.items():
        if "hostPath" in v:
            path = v["hostPath"]["path"].rstrip("/") or "/"
            if path in ALLOWED_HOST_PATHS:
                pass
            elif not gpu_only:
                p(f"volume {vname}: hostPath {path} is not on the allowlist {sorted(ALLOWED_HOST_PATHS)}")
            elif path in GPU_HOST_DIRS:
                if v["hostPath"].get("type") != "Directory":
                    p(f"volume {vname}: hostPath {path} must be type Directory (nothing created on the host)")
            else:
                # The NVIDIA driver's NVML, one file: never the directory, never through a
                # subPath (the kubelet makes a missing subPath a directory, on the host).
                uses = [m for _, m in mounts if m["name"] == vname]
                ok = (os.path.basename(path) == NVML_FILE and v["hostPath"].get("type") == "File"
                      and uses and all(os.path.basename(m["mountPath"]) == NVML_FILE and "subPath" not in m
                                       for m in uses))
                if not ok:
                    p(f"volume {vname}: hostPath {path} is not on the allowlist {sorted(ALLOWED_HOST_PATHS)}, "
                      f"and may only be the driver's {NVML_FILE} itself (type: File), mounted as that file "
                      "without subPath")
        cm = v.get("configMap")
        if cm and not any(c["metadata"]["name"] == cm["name"] for c in by_kind(docs, "ConfigMap")):
            p(f"volume {vname}: ConfigMap {cm['name']} is not among the manifests")
        for c in by_kind(docs, "ConfigMap") if cm else []:
            text = (c.get("data") or {}).get("config.toml")
            if c["metadata"]["name"] == cm["name"] and text is not None:
                for problem in config_problems(text):
                    p(f"ConfigMap {cm['name']}: config.toml: {problem}")

    ports = set()
    for c in containers:
        cname = c.get("name", "?")
        sc = c.get("securityContext") or {}
        if sc.get("privileged") is True:
            p(f"container {cname}: privileged: true")
        if sc.get("allowPrivilegeEscalation") is not False:
            p(f"container {cname}: allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            p(f"container {cname}: readOnlyRootFilesystem must be true")
        caps = sc.get("capabilities") or {}
        drop = {x.upper().removeprefix("CAP_") for x in caps.get("drop", [])}
        if "ALL" not in drop:
            p(f"container {cname}: capabilities.drop must contain ALL")
        for cap in caps.get("add", []):
            bare = cap.upper().removeprefix("CAP_")
            if bare in PROC_FALLBACK_CAPABILITIES and bare not in ALLOWED_CAPABILITIES:
                p(f"container {cname}: unexpected capability {cap}: file paths come from the kernel with "
                  f"{sorted(ALLOWED_CAPABILITIES)} alone, and {cap} only serves the /proc fallback; add it to "
                  "ALLOWED_CAPABILITIES where that is deliberate (docs/kubernetes.md, Opting in to the /proc fallback)")
            elif bare not in ALLOWED_CAPABILITIES:
                p(f"container {cname}: unexpected capability {cap} (allowed: {sorted(ALLOWED_CAPABILITIES)})")
            elif documented_caps is not None and bare not in documented_caps:
                p(f"container {cname}: capability {cap} is not justified in docs/kubernetes.md")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ALLOWED_SECCOMP:
            p(f"container {cname}: seccompProfile must be one of {sorted(ALLOWED_SECCOMP)}, got {seccomp}")

        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:
                p(f"container {cname}: mount {m['name']} has no volume")
            elif "hostPath" in v and m.get("readOnly") is not True:
                p(f"container {cname}: host mount {m['name']} ({v['hostPath']['path']}) must be readOnly")

        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for where, table, key in (("requests", req, "cpu"), ("requests", req, "memory"), ("limits", lim, "memory")):
            if key not in table:
                p(f"container {cname}: resources.{where}.{key} missing")
            elif quantity(table[key]) is None or quantity(table[key]) <= 0:
                p(f"container {cname}: resources.{where}.{key} {table[key]!r} is not a positive quantity")
        if quantity(req.get("memory")) and quantity(lim.get("memory")) and quantity(lim["memory"]) < quantity(req["memory"]):
            p(f"container {cname}: memory limit below its request")
        for table in (req, lim):
            for key in table:
                if key.startswith("nvidia.com/"):
                    p(f"container {cname}: requests {key}: the agent must not take a GPU from the scheduler")

        if c in spec.get("containers", []):
            for probe, path in (("livenessProbe", "/-/healthy"), ("readinessProbe", "/-/ready")):
                got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
                if got != path:
                    p(f"container {cname}: {probe} must GET {path}, got {got}")
            env = {e["name"]: e for e in c.get("env", [])}
            field = (((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if field != "spec.nodeName":
                p(f"container {cname}: NODE_NAME must come from the downward API (fieldRef spec.nodeName)")
            args = c.get("args", []) + c.get("command", [])
            listen = [a for a in args if a.startswith("--web.listen-address=")]
            if not listen or listen[-1].split("=", 1)[1].startswith(("127.", "localhost", "[::1]")):
                p(f"container {cname}: --web.listen-address must be set explicitly to a non-loopback address")
            elif not re.fullmatch(r"(\[::\])?:[0-9]+", listen[-1].split("=", 1)[1]):
                p(f"container {cname}: --web.listen-address must be :PORT (every address of both families: "
                  f"IPv6-only and dual-stack clusters scrape over IPv6), got {listen[-1]}")
            ports |= {pt.get("name") for pt in c.get("ports", [])}
    return pod_labels, ports


def check(docs, documented_caps):
    problems = []
    p = problems.append

    daemonsets = {d["metadata"]["name"]: d for d in by_kind(docs, "DaemonSet")}
    if "sysscope" not in daemonsets or set(daemonsets) - {"sysscope", GPU_DAEMONSET}:
        p(f"expected the DaemonSet sysscope (and at most {GPU_DAEMONSET}), found {sorted(daemonsets)}")
        return problems
    all_pod_labels, ports = [], set()
    for ds in daemonsets.values():
        labels, ds_ports = check_daemonset(ds, docs, documented_caps, p)
        all_pod_labels.append(labels)
        ports |= ds_ports
    gpu = daemonsets.get(GPU_DAEMONSET)
    if gpu:
        base_spec = daemonsets["sysscope"]["spec"]["template"]["spec"]
        gpu_spec = gpu["spec"]["template"]["spec"]
        wanted = node_selector(gpu_spec)
        if not wanted:
            p(f"DaemonSet {GPU_DAEMONSET}: must select GPU nodes by a label (nodeSelector)")
        for k, v in wanted.items():
            if not excluded(base_spec, k, v):
                p(f"DaemonSet sysscope: must stay off the nodes {GPU_DAEMONSET} runs on "
                  f"(required node affinity {k} NotIn [{v}]): two agents on one node")
        if without_gpu_settings(gpu) != without_gpu_settings(daemonsets["sysscope"]):
            p(f"DaemonSet {GPU_DAEMONSET}: differs from sysscope beyond its GPU settings "
              "(components/gpu-nodes copies the pod spec of daemonset.yaml)")
    for name, ds in daemonsets.items():
        sel = ds["spec"].get("selector", {}).get("matchLabels", {})
        for other_name, other in daemonsets.items():
            labels = other["spec"]["template"]["metadata"].get("labels", {})
            if other_name != name and sel and all(labels.get(k) == v for k, v in sel.items()):
                p(f"DaemonSet {name}: its selector {sel} also matches the pods of {other_name}")

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
        if not sel or any(any(pl.get(k) != v for k, v in sel.items()) for pl in all_pod_labels):
            p(f"Service {svc['metadata']['name']}: selector {sel} does not select every DaemonSet's pods")

    for pm in by_kind(docs, "PodMonitor"):
        sel = pm["spec"].get("selector", {}).get("matchLabels", {})
        if not sel or any(any(pl.get(k) != v for k, v in sel.items()) for pl in all_pod_labels):
            p(f"PodMonitor {pm['metadata']['name']}: selector {sel} does not select every DaemonSet's pods")
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
    def ds(d, name="sysscope"):
        return next(x for x in by_kind(d, "DaemonSet") if x["metadata"]["name"] == name)

    def ds_container(d):
        return ds(d)["spec"]["template"]["spec"]["containers"][0]

    def gpu_spec(d):
        return ds(d, GPU_DAEMONSET)["spec"]["template"]["spec"]

    def mutate(fn):
        d = copy.deepcopy(docs)
        fn(d)
        return d

    mutations = {
        "privileged": lambda d: ds_container(d)["securityContext"].__setitem__("privileged", True),
        "no drop ALL": lambda d: ds_container(d)["securityContext"]["capabilities"].__setitem__("drop", []),
        "SYS_ADMIN added": lambda d: ds_container(d)["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
        "writable host mount": lambda d: [m.__setitem__("readOnly", False) for m in ds_container(d)["volumeMounts"]],
        "host root mounted": lambda d: ds(d)["spec"]["template"]["spec"]["volumes"].append(
            {"name": "root", "hostPath": {"path": "/"}}),
        "no resources": lambda d: ds_container(d).pop("resources"),
        "bad quantity": lambda d: ds_container(d)["resources"]["requests"].__setitem__("memory", "lots"),
        "writable root fs": lambda d: ds_container(d)["securityContext"].__setitem__("readOnlyRootFilesystem", False),
        "unconfined seccomp": lambda d: ds_container(d)["securityContext"].__setitem__(
            "seccompProfile", {"type": "Unconfined"}),
        "no liveness probe": lambda d: ds_container(d).pop("livenessProbe"),
        "loopback listen": lambda d: ds_container(d).__setitem__("args", ["--web.listen-address=127.0.0.1:9812"]),
        "IPv4-only listen": lambda d: ds_container(d).__setitem__("args", ["--web.listen-address=0.0.0.0:9812"]),
        "secrets readable": lambda d: by_kind(d, "ClusterRole")[0]["rules"].append(
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
        "hostNetwork": lambda d: ds(d)["spec"]["template"]["spec"].__setitem__(
            "hostNetwork", True),
        "RuntimeClass on every node": lambda d: ds(d)["spec"]["template"]["spec"].__setitem__(
            "runtimeClassName", "nvidia"),
        "SYS_PTRACE added": lambda d: ds_container(d)["securityContext"]["capabilities"]["add"].append(
            "SYS_PTRACE"),
        "file paths off": lambda d: [c["data"].__setitem__("config.toml", re.sub(
            r"(?m)^resolve_file_paths = true$", "resolve_file_paths = false", c["data"]["config.toml"]))
            for c in by_kind(d, "ConfigMap") if "config.toml" in (c.get("data") or {})],
        "config.toml not TOML": lambda d: [c["data"].__setitem__("config.toml", "[slow_calls\n")
                                           for c in by_kind(d, "ConfigMap") if "config.toml" in (c.get("data") or {})],
    }
    if any(x["metadata"]["name"] == GPU_DAEMONSET for x in by_kind(docs, "DaemonSet")):
        mutations.update({
            "GPU requested": lambda d: gpu_spec(d)["containers"][0]["resources"].setdefault(
                "limits", {}).__setitem__("nvidia.com/gpu", 1),
            "two agents on GPU nodes": lambda d: ds(d)["spec"]["template"]["spec"].pop("affinity"),
            "GPU DaemonSet drifted": lambda d: gpu_spec(d)["containers"][0]["resources"]["limits"].__setitem__(
                "memory", "2Gi"),
            "driver directory mounted whole": lambda d: gpu_spec(d)["volumes"].append(
                {"name": "driver", "hostPath": {"path": "/usr/lib64"}}) or gpu_spec(d)["containers"][0][
                "volumeMounts"].append({"name": "driver", "mountPath": "/host/lib", "readOnly": True}),
            "driver's NVML through subPath": lambda d: gpu_spec(d)["volumes"].append(
                {"name": "driver", "hostPath": {"path": "/usr/lib64", "type": "Directory"}}) or gpu_spec(d)[
                "containers"][0]["volumeMounts"].append(
                {"name": "driver", "mountPath": "/usr/local/nvidia/lib64/" + NVML_FILE, "subPath": NVML_FILE,
                 "readOnly": True}),
            "driver's NVML without type File": lambda d: gpu_spec(d)["volumes"].append(
                {"name": "driver", "hostPath": {"path": "/usr/lib64/" + NVML_FILE}}) or gpu_spec(d)[
                "containers"][0]["volumeMounts"].append(
                {"name": "driver", "mountPath": "/usr/local/nvidia/lib64/" + NVML_FILE, "readOnly": True}),
            "selectors overlap": lambda d: ds(d)["spec"].__setitem__(
                "selector", {"matchLabels": {"app.kubernetes.io/name": "sysscope"}}),
        })
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
