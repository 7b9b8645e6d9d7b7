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

Prints one line per failed check and a last line "OK: ..." or "FAIL: ..."; exits 1 on failure.
With --self-test, also proves that each check fails on a mutated copy.
"""

import argparse
import copy
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


CHECKS = {
    "scrape": check_scrape,
    "release": check_release,
    "no-release": check_no_release,
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
