"""What a message shows of a value: a URI without its credentials, a number as the number it is."""

from __future__ import annotations

import string

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainpipe.contract.errors import InputError
from trainpipe.contract.text import plain, redact
from trainpipe.data import preconditions

pytestmark = pytest.mark.unit

SCHEMES = st.sampled_from(["http", "https", "postgresql", "postgresql+psycopg2", "mysql", "mssql"])
HOSTS = st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z][a-z0-9-]{0,8}){0,2}", fullmatch=True)
PORTS = st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"))
#: A path may hold an ``@`` (``/data/x@y/mlflow.db``) and anything else a path holds.
PATHS = st.one_of(st.just(""), st.text(string.ascii_letters + string.digits + "/@._-~", max_size=30).map("/{}".format))
USERS = st.text(string.ascii_letters + string.digits + "._-~%", min_size=1, max_size=12)
#: A password as people write them in URLs, unescaped: anything but ``@`` (which must be %40).
PASSWORDS = (
    st.text(string.printable.replace("@", "").strip() + " ", min_size=1, max_size=16).map(str.strip).filter(bool)
)


@settings(max_examples=150, deadline=None)
@given(SCHEMES, USERS, st.one_of(st.none(), PASSWORDS), HOSTS, PORTS, PATHS)
def test_a_uri_keeps_nothing_of_its_credentials(scheme, user, password, host, port, path):
    uri = f"{scheme}://{user}{':' + password if password is not None else ''}@{host}{port}{path}"
    shown = redact(uri)
    public = f"{host}{port}{path}"
    assert shown.startswith(f"{scheme}://***@")
    # what is left is the end of the part without credentials: never a character of the password
    assert public.endswith(shown[len(f"{scheme}://***@") :])
    if "@" not in path or not port:
        assert shown == f"{scheme}://***@{public}"


@settings(max_examples=100, deadline=None)
@given(PATHS, HOSTS)
def test_a_uri_without_credentials_is_shown_as_it_is(path, host):
    tail = path.lstrip("/")
    for uri in (
        f"sqlite:///{tail}",
        f"sqlite:////{tail}",
        f"file:///{tail}",
        f"s3://{host}/{tail}",
        f"https://{host}{path}",
    ):
        assert redact(uri) == uri


def test_an_at_sign_in_a_sqlite_path_is_not_a_user():
    assert redact("sqlite:////data/x@y/mlflow.db") == "sqlite:////data/x@y/mlflow.db"
    assert redact("http://pusher:s3cret@gw.example:9091/x") == "http://***@gw.example:9091/x"


LABELS = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.floats(-1e6, 1e6, allow_nan=False).map(np.float64),
    st.booleans().map(np.bool_),
    st.text(string.ascii_letters, min_size=1, max_size=5).map(np.str_),
)


@settings(max_examples=100, deadline=None)
@given(LABELS)
def test_a_single_class_is_named_as_the_number_it_is(label):
    df = pd.DataFrame({"x": np.arange(40, dtype=np.float64), "y": np.repeat(np.asarray([label]), 40)})
    with pytest.raises(InputError) as e:
        preconditions.check_table(df, "y", "classification", batch_size=4, test_fraction=0.2, seed=0)
    assert f"has a single class ({plain(df['y'].iloc[0])!r})" in str(e.value)
    assert "np." not in str(e.value) and "numpy" not in str(e.value)


@given(LABELS)
def test_plain_is_the_python_value(label):
    value = plain(label)
    assert type(value) in (int, float, bool, str) and value == label


def test_a_missing_profile_file_is_named_as_the_profile_not_as_a_config(tmp_path):
    """A new user's ``profile: nothere.yaml`` read "config file ... does not exist": the pipeline config
    was there; the line names the field and what the file is."""
    from trainpipe.services.profiles import get_profile

    with pytest.raises(InputError) as exc:
        get_profile(str(tmp_path / "nothere.yaml"))
    assert str(exc.value).startswith("profile: hardware profile file ") and "does not exist" in str(exc.value)


def test_a_misspelt_profile_key_is_not_called_a_components_setting(tmp_path):
    """A new user's ``retires: 2`` in a profile file read "unknown key (not a setting of this component)":
    a profile is not a component."""
    from trainpipe.services.profiles import get_profile

    (tmp_path / "team.yaml").write_text("name: team\nretires: 2\n")
    with pytest.raises(InputError) as exc:
        get_profile(str(tmp_path / "team.yaml"))
    assert "'retires': unknown key (no such setting here)" in str(exc.value)
    assert "component" not in str(exc.value)


@pytest.mark.parametrize("code", ["eur", "EURO", "E1R", ""])
def test_a_currency_that_is_no_iso_4217_code_is_named_so(code, tmp_path):
    """The docs promise a currency that is not an ISO 4217 code is one line naming it; a new user's ``eur`` read
    "String should match pattern '^[A-Z]{3}$'"."""
    from trainpipe.services.profiles import get_profile

    (tmp_path / "team.yaml").write_text(f"name: team\nprices: {{currency: '{code}', cpu_core_hour: 0.04}}\n")
    with pytest.raises(InputError) as exc:
        get_profile(str(tmp_path / "team.yaml"))
    assert f"'prices.currency': {code!r} is not an ISO 4217 code (three capital letters" in str(exc.value)
    assert "pattern" not in str(exc.value)
