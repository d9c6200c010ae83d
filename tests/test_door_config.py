"""The front door's nginx config, without a server: nginx itself accepts every variant we render."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess

import pytest
from tritonclient.grpc import model_config_pb2

from lab_backends.errors import FrontDoorError
from lab_backends.learner import new_secret, token_for
from lab_backends.paths import MODEL_REPOSITORY
from lab_backends.server.door_config import GRPC_RESTRICTED, HTTP_RESTRICTED, DoorSettings, FairShare, render
from lab_backends.server.door_limits import JSON_BYTES_PER_ELEMENT, MIN_BODY, VARIABLE_DIM, body_limit
from lab_backends.server.front_door import nginx_binary
from lab_backends.server.options import RESTRICTED_APIS
from lab_backends.server.repository import read_config


def _settings(tmp_path, **changes) -> DoorSettings:
    return DoorSettings(**{"http_port": 18000, "grpc_port": 18001, "metrics_port": 18004, "triton_http_port": 18002,
                           "triton_grpc_port": 18003, "triton_metrics_port": 18005, "workdir": tmp_path,
                           "admin_key": "k3y-_.~K3Y",
                           **changes})


def test_every_restricted_api_has_its_http_paths_and_grpc_methods():
    assert set(HTTP_RESTRICTED) == set(GRPC_RESTRICTED) == set(RESTRICTED_APIS)


def test_the_body_limit_is_the_largest_json_request_at_max_batch():
    big = model_config_pb2.ModelConfig(name="big", max_batch_size=8)
    big.input.add(name="A", data_type=model_config_pb2.TYPE_FP32, dims=[-1, 100])
    big.input.add(name="B", data_type=model_config_pb2.TYPE_INT64, dims=[3])
    assert body_limit([big]) == 8 * (VARIABLE_DIM * 100 + 3) * JSON_BYTES_PER_ELEMENT
    small = read_config(MODEL_REPOSITORY / "cost_model")
    assert body_limit([small]) == MIN_BODY  # 64 x 16 floats fit in 1 MiB
    assert body_limit([small, big]) == body_limit([big])


def _accepted_by_nginx(tmp_path, settings) -> str:
    """The config rendered for ``settings``, after ``nginx -t`` accepted it (skipped without Debian's nginx)."""
    try:
        nginx = nginx_binary()
    except FrontDoorError as exc:
        pytest.skip(str(exc))
    for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / temp).mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(render(settings))
    check = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(settings.error_log)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    return conf.read_text()


@pytest.mark.parametrize("variant", ["keyed", "open", "class", "root", "learners"])
def test_nginx_accepts_the_rendered_config(tmp_path, variant):
    """``nginx -t`` on each variant: the key, open admin APIs, the class's subset, a root master, learners' shares."""
    if variant == "root" and os.geteuid() != 0:
        pytest.skip("a `user` directive is checked only by a root nginx")
    changes = {"open": {"admin_key": None}, "class": {"restricted_apis": ("model-repository", "trace")},
               "root": {"worker_user": "nobody"},
               "learners": {"fair_share": FairShare(new_secret(), in_flight=3, rate_per_s=7, burst=0)}}.get(variant, {})
    text = _accepted_by_nginx(tmp_path, _settings(tmp_path, **changes))
    if variant == "class":
        assert "ModelStatistics" not in text and "RepositoryModelLoad" in text  # statistics stay open
    if variant == "open":
        assert "k3y" not in text and "default 1;" in text
    # nginx's word on the learner, for the gateway, replaces any header of that name the client sent (issue 46)
    assert "proxy_set_header lab-door-learner $door_learner;" in text and "grpc_set_header lab-door-learner" in text
    if variant == "learners":
        assert "limit_conn door_in_flight 3;" in text and "rate=7r/s" in text and "limit_req zone=door_rate;" in text
        assert "return 401" in text and "grpc-status 16" in text  # a tokenless request, refused in a class
    else:
        # nothing is limited outside a class
        assert "limit_req" not in text and "limit_conn" not in text and "secure_link" not in text


def test_a_learners_token_is_unpadded_base64url_md5_of_name_and_secret():
    # What nginx's secure_link_md5 "$http_lab_learner <secret>" compares: the 16 bytes of the MD5 in
    # base64url are 22 characters and "==" of padding, which secure_link's value leaves out.
    assert token_for("s3cret", "ada") == base64.urlsafe_b64encode(hashlib.md5(b"ada s3cret").digest()).decode()[:22]
    assert token_for("s3cret", "ada") != token_for("s3cret", "bob") != token_for("other", "bob")
    with pytest.raises(ValueError, match="not a learner's name"):
        token_for("s3cret", "ada x")  # a space would move the boundary between the name and the secret


@pytest.mark.parametrize("share", [dict(secret="short"), dict(secret='a"; return 200; #' * 2),
                                   dict(secret=new_secret(), in_flight=0), dict(secret=new_secret(), burst=-1)])
def test_a_share_nginx_cannot_hold_is_refused_with_the_fix(share):
    with pytest.raises(FrontDoorError, match="learner"):
        FairShare(**share)


def test_a_key_nginx_cannot_quote_is_refused_with_the_fix(tmp_path):
    with pytest.raises(FrontDoorError, match="URL-safe characters only"):
        render(_settings(tmp_path, admin_key='a"; return 200; #'))


def test_under_standby_every_request_goes_through_the_gateway_and_metrics_fall_back(tmp_path):
    """``serve --standby`` (server/door_upstreams.py): the gateway alone chooses between the two tritonservers, so
    nginx sends it every HTTP method and every gRPC method; the metrics page tries the first server, then the second."""
    text = _accepted_by_nginx(tmp_path, _settings(tmp_path, gateway_http_port=18006, gateway_grpc_port=18007,
                                                  standby_metrics_port=18008))
    assert "default door_gateway;" in text and "grpc_pass grpc://127.0.0.1:18003" not in text
    assert "server 127.0.0.1:18008 backup max_fails=0;" in text and "proxy_pass http://door_metrics;" in text
    plain = render(_settings(tmp_path, gateway_http_port=18006, gateway_grpc_port=18007))
    assert "default door_triton;" in plain and "grpc_pass grpc://127.0.0.1:18003" in plain and "backup" not in plain
