#!/usr/bin/env python3
"""A multi-broker Kafka for the integration tests: librdkafka's mock cluster.

The confluent-kafka wheel bundles librdkafka, whose mock cluster is an
in-process implementation of the Kafka protocol with several brokers,
classic consumer groups, offsets and fault injection. This script starts one
through the shared library's `rd_kafka_mock_*` functions (ctypes), prints
where it is, and serves a control channel until it is stopped (SIGTERM,
SIGINT, or a `shutdown` command).

It prints, one per line, once the cluster is up:

    KAFKA_RETRY_BROKERS=127.0.0.1:P1,127.0.0.1:P2,...
    KAFKA_RETRY_MOCK_CONTROL=127.0.0.1:PC

The control channel is line-delimited JSON over TCP on loopback: each request
is one object with an "op" and its arguments, each answer one object,
`{"ok": true, ...}` or `{"ok": false, "error": "..."}`. Operations:

    ping
    bootstraps
    create_topic        topic, partitions, replication
    delete_topic        topic
    set_leader          topic, partition, broker (-1: no leader)
    set_follower        topic, partition, broker (fetches go to this follower)
    set_follower_wmarks topic, partition, lo, hi (-1: follow the leader)
    delete_records      topic, partition, before
    broker_down         broker
    broker_up           broker
    set_rtt             broker, rtt_ms
    set_coordinator     key_type ("group" or "transaction"), key, broker
    push_request_errors api_key, errors (error codes for the next requests of
                        that api, on any broker)
    push_broker_errors  broker, api_key, errors ([code, rtt_ms] pairs)
    push_partition_errors topic, partition, api_key, errors (for requests
                        about that partition only)
    push_leader_response topic, partition, leader, epoch (what the next
                        Metadata answer names as the partition's leader,
                        whoever leads it)
    clear_request_errors api_key
    topic_set_error     topic, error
    set_apiversion      api_key, min, max
    shutdown

The mock has no CreateTopics: topics are made with `create_topic`.
"""

import argparse
import ctypes
import glob
import json
import os
import signal
import socket
import socketserver
import sys
import threading


def load_librdkafka():
    """The librdkafka that the installed confluent-kafka wheel bundles."""
    import confluent_kafka

    package = os.path.dirname(confluent_kafka.__file__)
    candidates = sorted(glob.glob(os.path.join(package + ".libs", "librdkafka*.so*")))
    candidates += sorted(glob.glob(os.path.join(package, ".dylibs", "librdkafka*.dylib")))
    if not candidates:
        sys.exit(f"mock_cluster: no bundled librdkafka next to {package}: install a confluent-kafka wheel")
    lib = ctypes.CDLL(candidates[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2name.restype = ctypes.c_char_p
    lib.rd_kafka_err2name.argtypes = [ctypes.c_int]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    signatures = {
        "rd_kafka_mock_topic_create": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
        "rd_kafka_mock_topic_delete": [ctypes.c_char_p],
        "rd_kafka_mock_partition_set_leader": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32],
        "rd_kafka_mock_partition_set_follower": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32],
        "rd_kafka_mock_partition_set_follower_wmarks": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64],
        "rd_kafka_mock_partition_delete_records": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64],
        "rd_kafka_mock_broker_set_down": [ctypes.c_int32],
        "rd_kafka_mock_broker_set_up": [ctypes.c_int32],
        "rd_kafka_mock_broker_set_rtt": [ctypes.c_int32, ctypes.c_int],
        "rd_kafka_mock_coordinator_set": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32],
        "rd_kafka_mock_set_apiversion": [ctypes.c_int16, ctypes.c_int16, ctypes.c_int16],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] + args
    lib.rd_kafka_mock_push_request_errors_array.restype = None
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int16,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.rd_kafka_mock_clear_request_errors.restype = None
    lib.rd_kafka_mock_clear_request_errors.argtypes = [ctypes.c_void_p, ctypes.c_int16]
    lib.rd_kafka_mock_topic_set_error.restype = None
    lib.rd_kafka_mock_topic_set_error.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    # Variadic: (mcluster, broker_id, api_key, count, code, rtt, code, rtt, ...).
    lib.rd_kafka_mock_broker_push_request_error_rtts.restype = ctypes.c_int
    # Variadic: (mcluster, topic, partition, api_key, count, code, code, ...).
    lib.rd_kafka_mock_partition_push_request_errors.restype = ctypes.c_int
    lib.rd_kafka_mock_partition_push_leader_response.restype = ctypes.c_int
    lib.rd_kafka_mock_partition_push_leader_response.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_int32,
        ctypes.c_int32,
    ]
    return lib


class Cluster:
    def __init__(self, lib, brokers):
        self.lib = lib
        conf = lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        # The handle only hosts the cluster: keep its own logging quiet.
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
        self.rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # RD_KAFKA_PRODUCER
        if not self.rk:
            sys.exit(f"mock_cluster: rd_kafka_new failed: {errstr.value.decode()}")
        self.mcluster = lib.rd_kafka_mock_cluster_new(self.rk, brokers)
        if not self.mcluster:
            sys.exit("mock_cluster: rd_kafka_mock_cluster_new failed")
        self.bootstraps = lib.rd_kafka_mock_cluster_bootstraps(self.mcluster).decode()
        self.lock = threading.Lock()

    def check(self, code, what):
        if code != 0:
            name = self.lib.rd_kafka_err2name(code).decode()
            raise ValueError(f"{what} failed: {name} ({code})")

    def handle(self, req):
        op = req.get("op")
        lib, mc = self.lib, self.mcluster
        enc = lambda key: req[key].encode()  # noqa: E731
        with self.lock:
            if op == "ping":
                return {}
            if op == "bootstraps":
                return {"bootstraps": self.bootstraps}
            if op == "create_topic":
                code = lib.rd_kafka_mock_topic_create(mc, enc("topic"), req["partitions"], req.get("replication", 1))
                self.check(code, f"creating topic {req['topic']}")
                return {}
            if op == "delete_topic":
                self.check(lib.rd_kafka_mock_topic_delete(mc, enc("topic")), "deleting a topic")
                return {}
            if op == "set_leader":
                code = lib.rd_kafka_mock_partition_set_leader(mc, enc("topic"), req["partition"], req["broker"])
                self.check(code, "setting a leader")
                return {}
            if op == "set_follower":
                code = lib.rd_kafka_mock_partition_set_follower(mc, enc("topic"), req["partition"], req["broker"])
                self.check(code, "setting a follower")
                return {}
            if op == "set_follower_wmarks":
                code = lib.rd_kafka_mock_partition_set_follower_wmarks(
                    mc, enc("topic"), req["partition"], req["lo"], req["hi"]
                )
                self.check(code, "setting follower watermarks")
                return {}
            if op == "delete_records":
                code = lib.rd_kafka_mock_partition_delete_records(mc, enc("topic"), req["partition"], req["before"])
                self.check(code, "deleting records")
                return {}
            if op == "broker_down":
                self.check(lib.rd_kafka_mock_broker_set_down(mc, req["broker"]), "taking a broker down")
                return {}
            if op == "broker_up":
                self.check(lib.rd_kafka_mock_broker_set_up(mc, req["broker"]), "bringing a broker up")
                return {}
            if op == "set_rtt":
                self.check(lib.rd_kafka_mock_broker_set_rtt(mc, req["broker"], req["rtt_ms"]), "setting a latency")
                return {}
            if op == "set_coordinator":
                code = lib.rd_kafka_mock_coordinator_set(mc, enc("key_type"), enc("key"), req["broker"])
                self.check(code, "moving a coordinator")
                return {}
            if op == "push_request_errors":
                errors = req["errors"]
                array = (ctypes.c_int * len(errors))(*errors)
                lib.rd_kafka_mock_push_request_errors_array(mc, req["api_key"], len(errors), array)
                return {}
            if op == "push_broker_errors":
                pairs = req["errors"]
                flat = []
                for code, rtt in pairs:
                    flat += [ctypes.c_int(code), ctypes.c_int(rtt)]
                code = lib.rd_kafka_mock_broker_push_request_error_rtts(
                    ctypes.c_void_p(mc),
                    ctypes.c_int32(req["broker"]),
                    ctypes.c_int16(req["api_key"]),
                    ctypes.c_size_t(len(pairs)),
                    *flat,
                )
                self.check(code, "pushing broker errors")
                return {}
            if op == "push_partition_errors":
                errors = [ctypes.c_int(code) for code in req["errors"]]
                code = lib.rd_kafka_mock_partition_push_request_errors(
                    ctypes.c_void_p(mc),
                    ctypes.c_char_p(enc("topic")),
                    ctypes.c_int32(req["partition"]),
                    ctypes.c_int16(req["api_key"]),
                    ctypes.c_size_t(len(errors)),
                    *errors,
                )
                self.check(code, "pushing partition errors")
                return {}
            if op == "push_leader_response":
                code = lib.rd_kafka_mock_partition_push_leader_response(
                    mc, enc("topic"), req["partition"], req["leader"], req["epoch"]
                )
                self.check(code, "pushing a leader response")
                return {}
            if op == "clear_request_errors":
                lib.rd_kafka_mock_clear_request_errors(mc, req["api_key"])
                return {}
            if op == "topic_set_error":
                lib.rd_kafka_mock_topic_set_error(mc, enc("topic"), req["error"])
                return {}
            if op == "set_apiversion":
                code = lib.rd_kafka_mock_set_apiversion(mc, req["api_key"], req["min"], req["max"])
                self.check(code, "setting api versions")
                return {}
            raise ValueError(f"unknown op {op!r}")

    def destroy(self):
        self.lib.rd_kafka_mock_cluster_destroy(self.mcluster)
        self.lib.rd_kafka_destroy(self.rk)


def serve(cluster, stop):
    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                line = line.strip()
                if not line:
                    continue
                try:
                    req = json.loads(line)
                    if req.get("op") == "shutdown":
                        answer = {"ok": True}
                        stop.set()
                    else:
                        answer = {"ok": True, **cluster.handle(req)}
                except (KeyError, TypeError, ValueError) as e:
                    answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                self.wfile.write(json.dumps(answer).encode() + b"\n")
                self.wfile.flush()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    args = parser.parse_args()
    if not 1 <= args.brokers <= 16:
        sys.exit("mock_cluster: --brokers must be between 1 and 16")

    cluster = Cluster(load_librdkafka(), args.brokers)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = serve(cluster, stop)
    host, port = server.server_address
    print(f"KAFKA_RETRY_BROKERS={cluster.bootstraps}", flush=True)
    print(f"KAFKA_RETRY_MOCK_CONTROL={host}:{port}", flush=True)
    while not stop.wait(1.0):
        pass
    server.shutdown()
    cluster.destroy()


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    main()
