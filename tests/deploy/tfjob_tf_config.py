#!/usr/bin/env python3
"""The TF_CONFIG that Kubeflow's training operator sets in each pod of a TFJob.

    python tests/deploy/tfjob_tf_config.py [--namespace NS] [--cluster-domain D] deploy/k8s/tfjob.yaml

prints one line per replica, host 0 of psrt first (chief, worker, ps, then
any other type):

    <type> <index> <host name without port> <TF_CONFIG>

for example

    chief 0 psrt-chief-0.default.svc {"cluster":{"chief":["psrt-chief-0.default.svc:7071"],...},"task":{"type":"chief","index":0},"environment":"cloud"}

TF_CONFIG is compact JSON without spaces, so a line splits into its four
fields at the first three spaces. A job of a single replica gets no TF_CONFIG
from the operator; its line says "-".

The rules are those of the operator's TFJob controller (kubeflow/training-operator,
pkg/controller.v1/tensorflow: tensorflow.go genTFConfigJSONStr and
genClusterSpec, util.go GetPortFromTFJob and isDistributed; defaults from
pkg/apis/kubeflow.org/v1/tensorflow_defaults.go):
- replica types are matched case-insensitively and named in lower case;
  replicas default to 1;
- an address is "<job>-<type>-<index>.<namespace>.svc[.<CUSTOM_CLUSTER_DOMAIN>]:<port>"
  ("/" in it replaced by "-"), the port being the "tfjob-port" of the
  container named "tensorflow" (2222 without one);
- the cluster lists every replica type, keys sorted (Go marshals maps so);
  the JSON is Go's encoding/json: fields cluster, task, environment ("cloud");
- with spec.enableDynamicWorker the operator writes the sparse form
  {"sparseCluster": {"worker": {...}, "ps": [...]}, "task": {...}} instead;
- TF_CONFIG goes into the environment of the "tensorflow" container only.

The namespace is metadata.namespace, else --namespace (default "default",
where kubectl puts a manifest without one).
"""

import argparse
import json
import sys
from collections import namedtuple

import yaml

DEFAULT_CONTAINER = "tensorflow"
DEFAULT_PORT_NAME = "tfjob-port"
DEFAULT_PORT = 2222
# The operator's replica types, in the case it normalises them to.
REPLICA_TYPES = ("PS", "Worker", "Chief", "Master", "Evaluator")
# psrt numbers its hosts in this order (common/cluster.h); host 0 runs the
# coordinator.
PSRT_ORDER = ("chief", "worker", "ps")

Replica = namedtuple("Replica", "type index host tf_config")


def load_tfjob(path):
    """The first kubeflow.org TFJob document in the YAML file at `path`."""
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") == "TFJob" and str(doc.get("apiVersion", "")).startswith("kubeflow.org/"):
                return doc
    raise ValueError("%s: no kubeflow.org TFJob in it" % path)


def _camel_case(specs):
    # setTypeNameToCamelCase: a key equal to a known type but for case takes
    # the known spelling; other keys stay as they are.
    out = {}
    for key, spec in specs.items():
        known = [t for t in REPLICA_TYPES if t.lower() == str(key).lower()]
        out[known[0] if known else key] = spec
    return out


def _replicas(spec):
    n = (spec or {}).get("replicas")
    return 1 if n is None else int(n)


def _port(spec):
    containers = (((spec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == DEFAULT_CONTAINER:
            for port in container.get("ports") or []:
                if port.get("name") == DEFAULT_PORT_NAME:
                    return int(port["containerPort"])
    return DEFAULT_PORT


def _go_json(value):
    # encoding/json: compact, non-ASCII as UTF-8, but <, >, & and the line
    # and paragraph separators escaped.
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def host_name(job, rtype, index, namespace, cluster_domain=""):
    """The DNS name of a replica's Service, as TF_CONFIG names it (no port)."""
    name = ("%s-%s-%d" % (job, rtype.lower(), index)).replace("/", "-")
    name += "." + namespace + ".svc"
    if cluster_domain:
        name += "." + cluster_domain
    return name


def cluster_spec(tfjob, namespace, cluster_domain=""):
    specs = _camel_case(tfjob["spec"]["tfReplicaSpecs"])
    cluster = {}
    for rtype, spec in specs.items():
        port = _port(spec)
        cluster[str(rtype).lower()] = ["%s:%d" % (host_name(tfjob["metadata"]["name"], str(rtype), i, namespace,
                                                            cluster_domain), port)
                                       for i in range(_replicas(spec))]
    return dict(sorted(cluster.items()))


def is_distributed(tfjob):
    specs = _camel_case(tfjob["spec"]["tfReplicaSpecs"])
    return sum(_replicas(specs[t]) for t in ("Chief", "Evaluator", "Master", "PS", "Worker") if t in specs) != 1


def tf_config(tfjob, rtype, index, namespace, cluster_domain=""):
    """TF_CONFIG of replica `index` of type `rtype` (any case), or None where
    the operator sets none."""
    if not is_distributed(tfjob):
        return None
    cluster = cluster_spec(tfjob, namespace, cluster_domain)
    rt = rtype.lower()
    task = {"type": rt, "index": int(index)}
    if tfjob["spec"].get("enableDynamicWorker"):
        sparse = {"worker": {}, "ps": []}
        if rt == "ps":
            sparse["ps"] = [cluster[rt][index]]
        elif rt == "worker":
            sparse["ps"] = cluster.get("ps")  # nil (null) without a PS replica
            sparse["worker"] = {str(index): cluster[rt][index]}
        return _go_json({"sparseCluster": sparse, "task": task})
    return _go_json({"cluster": cluster, "task": task, "environment": "cloud"})


def replicas(tfjob, namespace=None, cluster_domain=""):
    """Every replica of the TFJob (a dict), psrt's host 0 first."""
    namespace = tfjob["metadata"].get("namespace") or namespace or "default"
    specs = _camel_case(tfjob["spec"]["tfReplicaSpecs"])
    types = sorted((str(t).lower() for t in specs),
                   key=lambda t: (PSRT_ORDER.index(t) if t in PSRT_ORDER else len(PSRT_ORDER), t))
    by_lower = {str(t).lower(): spec for t, spec in specs.items()}
    out = []
    for rt in types:
        for i in range(_replicas(by_lower[rt])):
            out.append(Replica(rt, i, host_name(tfjob["metadata"]["name"], rt, i, namespace, cluster_domain),
                               tf_config(tfjob, rt, i, namespace, cluster_domain)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest", help="YAML file holding a kubeflow.org/v1 TFJob")
    p.add_argument("--namespace", default=None,
                   help="namespace when the TFJob names none (default: default)")
    p.add_argument("--cluster-domain", default="",
                   help="the operator's CUSTOM_CLUSTER_DOMAIN, e.g. cluster.local (default: none)")
    args = p.parse_args(argv)
    try:
        tfjob = load_tfjob(args.manifest)
        for r in replicas(tfjob, args.namespace, args.cluster_domain):
            print(r.type, r.index, r.host, r.tf_config if r.tf_config is not None else "-")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print("tfjob_tf_config: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
