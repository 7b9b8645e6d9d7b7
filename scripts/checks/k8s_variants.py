#!/usr/bin/env python3
"""What each rendered variant of deploy/kubernetes must carry, beyond the posture checks.

scripts/checks/kubernetes.sh renders every variant and runs this once per rendering:

    k8s_variants.py RENDERED.yaml --expect CHECK[,CHECK...]

Checks (each one a promise the docs make to a user who enables the component):
  scrape          the PodMonitor asks for the protobuf exposition first (scrapeProtocols), so
                  the duration histograms arrive as native histograms where Prometheus takes them
  release         (components/kube-prometheus-stack) the PodMonitor and the PrometheusRule carry
                  the `release` label kube-prometheus-stack's selectors ask for, and the
                  PodMonitor turns native histograms on (scrapeNativeHistograms)
  no-release      the label is not there (it would name a Helm release the user may not have)
  no-credential   no DaemonSet probe sends an Authorization header, no literal env value or
                  argument looks like a password or token, and no string anywhere in the
                  rendering is a Basic/Bearer credential
  priority        every DaemonSet has a priorityClassName that a PriorityClass of the rendering
                  (or a system-* class) defines
  toolkit-wait    (GPU Operator) sysscope-gpu waits in an init container for the toolkit's
                  /run/nvidia/validations/toolkit-ready, mounted read-only from the host
  nvml-debian-amd64, nvml-debian-arm64, nvml-lib64
                  (host driver) sysscope-gpu mounts the driver's NVML from that platform's path
  lean            the shipped config.toml drops `cgroup` where the pod is known
                  (labels.cgroup = "unless_pod_known"): no new series at every container restart
  web-auth        (components/web-auth) every DaemonSet reads --web.config.file from the Secret
                  sysscope-web and probes over HTTPS; the PodMonitor scrapes https with basicAuth
                  and the CA from the Secret sysscope-scrape

Prints one line per failed check and a last line "OK: ..." or "FAIL: ..."; exits 1 on failure.
With --self-test, also proves that each check fails on a mutated copy.
"""

import argparse
import copy
import re
import sys

import yaml

RELEASE = "kube-prometheus-stack"


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def labels(d):
    return (d.get("metadata") or {}).get("labels") or {}


def check_scrape(docs):
    problems = []
    for pm in by_kind(docs, "PodMonitor"):
        protocols = pm["spec"].get("scrapeProtocols") or []
        if not protocols or protocols[0] != "PrometheusProto":
            problems.append(f"PodMonitor {pm['metadata']['name']}: scrapeProtocols must list "
                            f"PrometheusProto first (native histograms), got {protocols}")
    if not by_kind(docs, "PodMonitor"):
        problems.append("no PodMonitor")
    return problems


def check_release(docs):
    problems = []
    for kind in ("PodMonitor", "PrometheusRule"):
        objs = by_kind(docs, kind)
        if not objs:
            problems.append(f"no {kind}: components/kube-prometheus-stack must bring it")
        for o in objs:
            if labels(o).get("release") != RELEASE:
                problems.append(f"{kind} {o['metadata']['name']}: label release={RELEASE} missing "
                                "(kube-prometheus-stack's Prometheus would ignore it)")
    for pm in by_kind(docs, "PodMonitor"):
        if pm["spec"].get("scrapeNativeHistograms") is not True:
            problems.append(f"PodMonitor {pm['metadata']['name']}: scrapeNativeHistograms must be true")
    return problems


def check_no_release(docs):
    return [f"{o['kind']} {o['metadata']['name']}: carries a release label without "
            "components/kube-prometheus-stack"
            for o in docs if "release" in labels(o)]


SECRET_NAME = re.compile(r"(?i)pass|token|secret|credential|auth")
CREDENTIAL = re.compile(r"(?i)^\s*(basic|bearer)\s+\S{6,}")


def containers(ds):
    spec = ds["spec"]["template"]["spec"]
    return spec.get("containers", []) + spec.get("initContainers", [])


def strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from strings(v)


def check_no_credential(docs):
    problems = []
    for ds in by_kind(docs, "DaemonSet"):
        name = ds["metadata"]["name"]
        for c in containers(ds):
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                for h in ((c.get(probe) or {}).get("httpGet") or {}).get("httpHeaders") or []:
                    if h.get("name", "").lower() in ("authorization", "proxy-authorization"):
                        problems.append(f"DaemonSet {name}: {probe} sends an {h['name']} header "
                                        "(readable by anyone who can read DaemonSets)")
            for e in c.get("env", []):
                if "value" in e and SECRET_NAME.search(e["name"]):
                    problems.append(f"DaemonSet {name}: env {e['name']} holds a literal value "
                                    "(take it from a Secret)")
            for a in c.get("args", []) + c.get("command", []):
                if re.search(r"(?i)pass(word)?=|token=|://[^/@\s]+:[^/@\s]+@", a):
                    problems.append(f"DaemonSet {name}: argument {a!r} holds a credential")
    for d in docs:
        if d.get("kind") == "Secret":
            continue
        for s in strings(d):
            if CREDENTIAL.search(s):
                problems.append(f"{d.get('kind')} {d.get('metadata', {}).get('name')}: holds a credential {s[:12]!r}...")
    return problems


def check_web_auth(docs):
    problems = []
    for ds in by_kind(docs, "DaemonSet"):
        name = ds["metadata"]["name"]
        spec = ds["spec"]["template"]["spec"]
        c = spec["containers"][0]
        if "--web.config.file=/etc/sysscope-web/web.yml" not in c.get("args", []):
            problems.append(f"DaemonSet {name}: no --web.config.file")
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        if (vols.get("web") or {}).get("secret", {}).get("secretName") != "sysscope-web":
            problems.append(f"DaemonSet {name}: the web config is not the Secret sysscope-web")
        for probe in ("livenessProbe", "readinessProbe"):
            if ((c.get(probe) or {}).get("httpGet") or {}).get("scheme") != "HTTPS":
                problems.append(f"DaemonSet {name}: {probe} must use HTTPS (the port serves TLS only)")
    for pm in by_kind(docs, "PodMonitor"):
        for ep in pm["spec"].get("podMetricsEndpoints", []):
            where = f"PodMonitor {pm['metadata']['name']} port {ep.get('port')}"
            if ep.get("scheme") != "https":
                problems.append(f"{where}: scheme must be https")
            auth = ep.get("basicAuth") or {}
            for key in ("username", "password"):
                ref = auth.get(key) or {}
                if ref.get("name") != "sysscope-scrape" or not ref.get("key"):
                    problems.append(f"{where}: basicAuth.{key} must come from the Secret sysscope-scrape")
            ca = ((ep.get("tlsConfig") or {}).get("ca") or {}).get("secret") or {}
            if ca.get("name") != "sysscope-scrape" or not (ep.get("tlsConfig") or {}).get("serverName"):
                problems.append(f"{where}: tlsConfig needs the CA from the Secret sysscope-scrape and a serverName")
    if not by_kind(docs, "PodMonitor"):
        problems.append("no PodMonitor")
    return problems


def check_priority(docs):
    classes = {c["metadata"]["name"] for c in by_kind(docs, "PriorityClass")}
    problems = []
    for ds in by_kind(docs, "DaemonSet"):
        pc = ds["spec"]["template"]["spec"].get("priorityClassName")
        if not pc:
            problems.append(f"DaemonSet {ds['metadata']['name']}: no priorityClassName (Pending on full GPU nodes)")
        elif pc not in classes and not pc.startswith("system-"):
            problems.append(f"DaemonSet {ds['metadata']['name']}: PriorityClass {pc} is not defined")
    return problems


TOOLKIT_READY = "/run/nvidia/validations/toolkit-ready"


def gpu_daemonset(docs):
    return next((d for d in by_kind(docs, "DaemonSet") if d["metadata"]["name"] == "sysscope-gpu"), None)


def check_toolkit_wait(docs):
    ds = gpu_daemonset(docs)
    if not ds:
        return ["no DaemonSet sysscope-gpu"]
    spec = ds["spec"]["template"]["spec"]
    inits = spec.get("initContainers") or []
    wait = [c for c in inits if c.get("args", [])[:1] == ["wait-for-file"]]
    if not wait or wait[0]["args"][1:] != [TOOLKIT_READY]:
        return [f"DaemonSet sysscope-gpu: no init container waits for {TOOLKIT_READY} (sysscope wait-for-file)"]
    main_image = spec["containers"][0].get("image")
    problems = []
    if wait[0].get("image") != main_image:
        problems.append(f"DaemonSet sysscope-gpu: the wait runs {wait[0].get('image')}, not the agent's {main_image}")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = [m for m in wait[0].get("volumeMounts", [])
              if TOOLKIT_READY.startswith(m["mountPath"].rstrip("/") + "/")]
    host = [((vols.get(m["name"]) or {}).get("hostPath") or {}).get("path") for m in mounts]
    if not mounts or host[0] != mounts[0]["mountPath"] or mounts[0].get("readOnly") is not True:
        problems.append("DaemonSet sysscope-gpu: the wait must see the host's /run/nvidia/validations, read-only")
    return problems


NVML_PATHS = {
    "nvml-debian-amd64": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "nvml-debian-arm64": "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "nvml-lib64": "/usr/lib64/libnvidia-ml.so.1",
}


def check_nvml(which):
    def check(docs):
        ds = gpu_daemonset(docs)
        if not ds:
            return ["no DaemonSet sysscope-gpu"]
        paths = [v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"].get("volumes", [])
                 if "hostPath" in v and v["hostPath"]["path"].endswith("/libnvidia-ml.so.1")]
        if paths != [NVML_PATHS[which]]:
            return [f"DaemonSet sysscope-gpu: NVML must be mounted from {NVML_PATHS[which]}, got {paths}"]
        return []
    return check


def check_lean(docs):
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    texts = [(c.get("data") or {}).get("config.toml") for c in by_kind(docs, "ConfigMap")]
    texts = [t for t in texts if t is not None]
    if not texts:
        return ["no ConfigMap with config.toml"]
    cgroup = tomllib.loads(texts[0]).get("labels", {}).get("cgroup", "always")
    if cgroup != "unless_pod_known":
        return [f'config.toml: labels.cgroup = "{cgroup}"; the DaemonSet ships "unless_pod_known" '
                "(a new set of series at every container restart otherwise)"]
    return []


CHECKS = {
    "scrape": check_scrape,
    "release": check_release,
    "no-release": check_no_release,
    "no-credential": check_no_credential,
    "web-auth": check_web_auth,
    "priority": check_priority,
    "lean": check_lean,
    "toolkit-wait": check_toolkit_wait,
    **{k: check_nvml(k) for k in NVML_PATHS},
}


def mutations():
    """(check, what, mutation): each mutation must make that check fail."""
    def pms(d):
        return by_kind(d, "PodMonitor")

    return [
        ("scrape", "text first", lambda d: [pm["spec"].__setitem__(
            "scrapeProtocols", ["PrometheusText0.0.4", "PrometheusProto"]) for pm in pms(d)]),
        ("scrape", "no scrapeProtocols", lambda d: [pm["spec"].pop("scrapeProtocols", None) for pm in pms(d)]),
        ("release", "rule unlabelled", lambda d: [labels(r).pop("release", None)
                                                  for r in by_kind(d, "PrometheusRule")]),
        ("release", "PodMonitor unlabelled", lambda d: [labels(p).pop("release", None) for p in pms(d)]),
        ("release", "no rule", lambda d: d.__setitem__(slice(None), [x for x in d if x.get("kind") != "PrometheusRule"])),
        ("release", "native histograms off", lambda d: [pm["spec"].pop("scrapeNativeHistograms", None)
                                                        for pm in pms(d)]),
        ("no-credential", "probe header", lambda d: [c.setdefault("livenessProbe", {}).setdefault(
            "httpGet", {}).__setitem__("httpHeaders", [{"name": "Authorization", "value": "Basic cHJvbTpwdw=="}])
            for ds in by_kind(d, "DaemonSet") for c in containers(ds)]),
        ("no-credential", "password in env", lambda d: [c.setdefault("env", []).append(
            {"name": "WEB_PASSWORD", "value": "hunter2"}) for ds in by_kind(d, "DaemonSet") for c in containers(ds)]),
        ("no-credential", "password argument", lambda d: [c.setdefault("args", []).append(
            "--web.password=hunter2") for ds in by_kind(d, "DaemonSet") for c in containers(ds)]),
        ("no-credential", "bearer token in a PodMonitor", lambda d: [pm["spec"].__setitem__(
            "x", {"headers": {"Authorization": "Bearer abcdefgh"}}) for pm in by_kind(d, "PodMonitor")]),
        ("web-auth", "probe over HTTP", lambda d: [ds["spec"]["template"]["spec"]["containers"][0][
            "readinessProbe"]["httpGet"].pop("scheme", None) for ds in by_kind(d, "DaemonSet")]),
        ("web-auth", "PodMonitor without basicAuth", lambda d: [ep.pop("basicAuth", None)
            for pm in by_kind(d, "PodMonitor") for ep in pm["spec"]["podMetricsEndpoints"]]),
        ("web-auth", "PodMonitor without CA", lambda d: [ep.pop("tlsConfig", None)
            for pm in by_kind(d, "PodMonitor") for ep in pm["spec"]["podMetricsEndpoints"]]),
        ("web-auth", "no web config", lambda d: [ds["spec"]["template"]["spec"]["containers"][0].__setitem__(
            "args", []) for ds in by_kind(d, "DaemonSet")]),
        ("priority", "no class", lambda d: [ds["spec"]["template"]["spec"].pop("priorityClassName", None)
                                            for ds in by_kind(d, "DaemonSet")[-1:]]),
        ("priority", "undefined class", lambda d: d.__setitem__(
            slice(None), [x for x in d if x.get("kind") != "PriorityClass"])),
        ("toolkit-wait", "no init container", lambda d: [ds["spec"]["template"]["spec"].pop("initContainers", None)
                                                         for ds in by_kind(d, "DaemonSet")]),
        ("toolkit-wait", "another image", lambda d: [c.__setitem__("image", "busybox")
                                                     for ds in by_kind(d, "DaemonSet")
                                                     for c in ds["spec"]["template"]["spec"].get("initContainers", [])]),
        ("toolkit-wait", "writable mount", lambda d: [m.__setitem__("readOnly", False)
                                                      for ds in by_kind(d, "DaemonSet")
                                                      for c in ds["spec"]["template"]["spec"].get("initContainers", [])
                                                      for m in c.get("volumeMounts", [])]),
        *[(k, "Debian amd64 path everywhere" if k != "nvml-debian-amd64" else "lib64 path",
           lambda d, k=k: [v["hostPath"].__setitem__("path", NVML_PATHS["nvml-debian-amd64" if k != "nvml-debian-amd64"
                                                                      else "nvml-lib64"])
                           for ds in by_kind(d, "DaemonSet") for v in ds["spec"]["template"]["spec"].get("volumes", [])
                           if "hostPath" in v and v["hostPath"]["path"].endswith("/libnvidia-ml.so.1")])
          for k in NVML_PATHS],
        ("lean", "cgroup always", lambda d: [c["data"].__setitem__("config.toml", c["data"]["config.toml"].replace(
            'cgroup = "unless_pod_known"', 'cgroup = "always"')) for c in by_kind(d, "ConfigMap")
            if "config.toml" in (c.get("data") or {})]),
        ("no-release", "labelled", lambda d: [p["metadata"].setdefault("labels", {}).__setitem__("release", "x")
                                             for p in pms(d)]),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rendered")
    ap.add_argument("--expect", required=True, help="comma-separated checks: " + ", ".join(CHECKS))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    with open(args.rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    wanted = [c for c in args.expect.split(",") if c]
    unknown = [c for c in wanted if c not in CHECKS]
    if unknown:
        print(f"FAIL: unknown checks {unknown}")
        return 1
    problems = [p for c in wanted for p in CHECKS[c](docs)]
    for p in problems:
        print(p)
    if problems:
        print(f"FAIL: {len(problems)} problem(s) in {args.rendered}")
        return 1
    caught = 0
    if args.self_test:
        missed = []
        for check, what, fn in mutations():
            if check not in wanted:
                continue
            d = copy.deepcopy(docs)
            fn(d)
            if CHECKS[check](d):
                caught += 1
            else:
                missed.append(f"{check}: {what}")
        for m in missed:
            print(f"self-test: the mutation '{m}' was not caught")
        if missed:
            print(f"FAIL: {len(missed)} mutations went unnoticed")
            return 1
    print(f"OK: {', '.join(wanted)}" + (f"; {caught} mutations caught" if args.self_test else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
