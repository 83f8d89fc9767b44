"""The scenario files' JSON Schema (emulator/study/schema.py): the shipped file is the generator's output, every
built-in study validates, and files the checker refuses for a key or a value the schema can express are refused
by the schema too."""

from __future__ import annotations

import tomllib

import jsonschema
import pytest

from emulator.model.errors import UserError
from emulator.study import scenario, schema

VALIDATOR = jsonschema.Draft202012Validator(schema.schema())
BASE = '[[traffic]]\npattern = "incast"\n[[variants]]\nname = "a"\napp = "ecmp"\n'


def test_the_shipped_file_is_the_generators_output():
    jsonschema.Draft202012Validator.check_schema(schema.schema())
    assert schema.FILE.read_text() == schema.text()


@pytest.mark.parametrize("name", scenario.builtin_names())
def test_every_builtin_study_validates(name):
    assert list(VALIDATOR.iter_errors(tomllib.loads((scenario.STUDIES_DIR / f"{name}.toml").read_text()))) == []


@pytest.mark.parametrize("text", [
    'colour = "red"\n' + BASE,
    BASE + '[quick]\ncolour = "red"\n',
    'seeds = []\n' + BASE,
    'capture = "yes"\n' + BASE,
    'controller = "udp:x"\n' + BASE,
    BASE.replace('app = "ecmp"', 'app = "ecmp"\nentropy = "sideways"'),
    BASE.replace('app = "ecmp"', 'app = "ecmp"\nwindow = 64'),
    BASE.replace('app = "ecmp"', 'app = "ecmp"\nspeed = 3'),
    BASE.replace('app = "ecmp"\n', ''),
    BASE.replace('pattern = "incast"', 'pattern = "incast"\ntrace = "x.jsonl"'),
    BASE + '[[faults]]\nat_s = 1.0\naction = "explode"\n',
    'capture = true\ncapture_bytes = 64\n' + BASE,
])
def test_known_bad_files_are_refused_by_the_schema_and_the_checker(text, tmp_path):
    assert list(VALIDATOR.iter_errors(tomllib.loads(text)))
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError):
        scenario.load(str(path))


def test_a_good_file_passes_both(tmp_path):
    text = 'capture = ["n0g0"]\nfocus = "incast"\n' + BASE.replace('app = "ecmp"', 'app = "ecmp"\ncc = "rtt"')
    assert list(VALIDATOR.iter_errors(tomllib.loads(text))) == []
    (tmp_path / "good.toml").write_text(text)
    assert scenario.load(str(tmp_path / "good.toml")).capture.ports == ("n0g0",)
