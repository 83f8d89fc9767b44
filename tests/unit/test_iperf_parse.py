"""iperf3 -J output turned into flow results: a normal run, iperf3's own errors, and output that is not
a result at all (recorded as an error, never raised)."""

from __future__ import annotations

import json

import pytest

from emulator.run.iperf import parse_iperf3


def _stream(start, end, nbytes, retransmits=None, sender=True):
    record = {"socket": 5, "start": start, "end": end, "seconds": end - start, "bytes": nbytes,
              "bits_per_second": nbytes * 8 / (end - start), "omitted": False, "sender": sender}
    if retransmits is not None:
        record.update(retransmits=retransmits, snd_cwnd=41480, snd_wnd=3141632, rtt=5215, rttvar=412,
                      pmtu=4200)
    return record


def _client_json(sent=9_961_472, received=9_699_328, seconds=8.0, retransmits=17):
    """What iperf3 3.12 `-c ... -J` prints for one TCP stream."""
    intervals = []
    for i in range(int(seconds)):
        stream = _stream(float(i), float(i + 1), sent // int(seconds), retransmits=2)
        intervals.append({"streams": [stream], "sum": {k: v for k, v in stream.items()
                                                       if k not in ("socket", "snd_cwnd", "snd_wnd", "rtt",
                                                                    "rttvar", "pmtu")}})
    return {
        "start": {
            "connected": [{"socket": 5, "local_host": "10.0.0.1", "local_port": 43512,
                           "remote_host": "10.16.0.6", "remote_port": 5203}],
            "version": "iperf 3.12",
            "system_info": "Linux n0g0 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 x86_64",
            "timestamp": {"time": "Tue, 02 Apr 2024 10:00:00 GMT", "timesecs": 1712052000},
            "connecting_to": {"host": "10.16.0.6", "port": 5203},
            "cookie": "u3b2ntgqyd7xk7qmp6klrr5fqbzqxmmsfpxf",
            "tcp_mss_default": 4148, "target_bitrate": 0, "fq_rate": 0, "sock_bufsize": 0,
            "sndbuf_actual": 16384, "rcvbuf_actual": 131072,
            "test_start": {"protocol": "TCP", "num_streams": 1, "blksize": 131072, "omit": 0,
                           "duration": int(seconds), "bytes": 0, "blocks": 0, "reverse": 0, "tos": 0,
                           "target_bitrate": 0, "bidir": 0, "fqrate": 0},
        },
        "intervals": intervals,
        "end": {
            "streams": [{"sender": {**_stream(0.0, seconds, sent), "retransmits": retransmits,
                                    "max_snd_cwnd": 82960, "max_rtt": 9120, "min_rtt": 412, "mean_rtt": 5012},
                         "receiver": _stream(0.0, seconds + 0.04, received)}],
            "sum_sent": {"start": 0, "end": seconds, "seconds": seconds, "bytes": sent,
                         "bits_per_second": sent * 8 / seconds, "retransmits": retransmits, "sender": True},
            "sum_received": {"start": 0, "end": seconds + 0.04, "seconds": seconds + 0.04, "bytes": received,
                             "bits_per_second": received * 8 / (seconds + 0.04), "sender": True},
            "cpu_utilization_percent": {"host_total": 1.9, "host_user": 0.2, "host_system": 1.7,
                                        "remote_total": 0.8, "remote_user": 0.1, "remote_system": 0.7},
            "sender_tcp_congestion": "cubic",
            "receiver_tcp_congestion": "cubic",
        },
    }


def test_parse_a_normal_run():
    text = json.dumps(_client_json(), indent=4)
    result = parse_iperf3(text, "n0g0", "n6g1")
    assert (result.src, result.dst) == ("n0g0", "n6g1")
    assert result.seconds == pytest.approx(8.04)
    assert result.sent_bytes == 9_961_472
    assert result.received_bytes == 9_699_328
    # goodput is what the receiver got, not what the sender pushed
    assert result.goodput_bps == pytest.approx(9_699_328 * 8 / 8.04)
    assert result.retransmits == 17
    assert result.congestion == "cubic"
    assert result.error == ""


def test_parse_a_run_without_retransmit_counts():
    data = _client_json()
    del data["end"]["sum_sent"]["retransmits"]  # iperf3 omits it where the kernel gives no TCP_INFO
    data["end"]["sender_tcp_congestion"] = "dctcp"
    result = parse_iperf3(json.dumps(data), "a", "b")
    assert result.retransmits == 0 and result.congestion == "dctcp"


def test_parse_an_error_only_json():
    text = json.dumps({"error": "unable to connect to server - server may have stopped running or use a "
                                "different port, firewall issue, etc.: Connection refused"})
    result = parse_iperf3(text, "n0g0", "n1g0")
    assert result.error.startswith("unable to connect")
    assert (result.sent_bytes, result.received_bytes, result.goodput_bps, result.seconds) == (0, 0, 0.0, 0.0)


def test_parse_an_error_after_the_test_started():
    # iperf3 -J also prints start/intervals/end around an error raised mid-test
    data = {"start": _client_json()["start"], "intervals": [], "end": {},
            "error": "error - control socket has closed unexpectedly"}
    result = parse_iperf3(json.dumps(data), "n0g0", "n1g0")
    assert result.error == "error - control socket has closed unexpectedly"
    assert result.goodput_bps == 0.0 and result.received_bytes == 0


@pytest.mark.parametrize("text", ["", "   \n", "iperf3: error - unable to connect to server: No route\n",
                                  '{"start": {"connected": [', "\x00\x00\x00",
                                  json.dumps(_client_json()) + json.dumps(_client_json())])
def test_garbage_is_recorded_not_raised(text):
    result = parse_iperf3(text, "n0g0", "n1g0")
    assert result.error
    assert result.goodput_bps == 0.0 and result.sent_bytes == 0


@pytest.mark.parametrize("text", ["null", "[]", "42", '"done"'])
def test_json_that_is_not_an_object_is_recorded_not_raised(text):
    result = parse_iperf3(text, "n0g0", "n1g0")
    assert result.error and result.goodput_bps == 0.0
