"""The Python client's format table (mxserve._wire) is the C++ one: both follow the
proto enum mxserve.v1.Format, and mxserve_format_table prints the C++ table
(proto/convert, which tests/proto_test.cc pins to the same enum) for comparison
(the conftest's `cpp_table`). test_enums.py does the same for every other enum."""

import pytest

from mxserve import _wire
from mxserve.v1 import common_pb2 as pb


def test_every_wire_format_has_the_name_the_proto_enum_gives_it():
    enum = {value.number: value.name for value in pb.Format.DESCRIPTOR.values}
    assert enum.pop(0) == "FORMAT_UNSPECIFIED"
    assert enum == {i + 1: "FORMAT_" + name for i, name in enumerate(_wire.FORMATS)}
    for number, wire_name in enum.items():
        name = wire_name[len("FORMAT_"):]
        assert _wire.format_to_wire(name) == number
        assert _wire.format_to_wire(name.lower()) == number
        assert _wire.format_to_wire(wire_name) == number
        assert _wire.format_to_wire(number) == number
        assert _wire.format_name(number) == name
    assert _wire.format_name(pb.FORMAT_UNSPECIFIED) == "policy"
    assert _wire.format_to_wire(None) == pb.FORMAT_UNSPECIFIED


def test_values_outside_the_enum_are_refused():
    top = max(value.number for value in pb.Format.DESCRIPTOR.values)
    assert _wire.format_name(top + 1) == f"format#{top + 1}"
    with pytest.raises(ValueError, match=f"format: unknown wire value {top + 1}; "
                                         f"expected 0..{top}"):
        _wire.format_to_wire(top + 1)
    with pytest.raises(ValueError, match="format: unknown wire value -1"):
        _wire.format_to_wire(-1)


def test_the_table_is_the_cpp_table(cpp_table):
    assert cpp_table["formats"] == [
        {"name": name, "wire": i + 1, "wire_name": "FORMAT_" + name}
        for i, name in enumerate(_wire.FORMATS)]
    assert cpp_table["aliases"] == _wire._FORMAT_ALIASES
    for alias, name in cpp_table["aliases"].items():
        assert _wire.format_to_wire(alias) == _wire.FORMATS.index(name) + 1
