"""The one name -> object registry every extension point uses (omni_rl/registry.py)."""
import pytest

from omni_rl.registry import Registry, RegistryError


def first_widget():
    return 1


def second_widget():
    return 2


def test_register_as_decorator_and_directly():
    widgets = Registry("widget")
    decorated = widgets.register("a")(first_widget)
    returned = widgets.register("b", second_widget)
    assert decorated is first_widget and returned is second_widget  # the target comes back unchanged
    assert widgets.get("a") is first_widget and widgets.get("b") is second_widget
    assert widgets.names() == ["a", "b"] and list(widgets) == ["a", "b"]
    assert "a" in widgets and "c" not in widgets and len(widgets) == 2


def test_duplicate_name_raises_naming_the_existing_owner():
    widgets = Registry("widget")
    widgets.register("a", first_widget)
    with pytest.raises(RegistryError) as info:
        widgets.register("a", second_widget)
    message = str(info.value)
    assert "widget 'a' is already registered" in message
    assert f"{first_widget.__module__}.{first_widget.__qualname__}" in message
    assert widgets.get("a") is first_widget  # the first owner keeps the name


def test_duplicate_through_the_decorator_also_raises():
    widgets = Registry("widget")
    widgets.register("a")(first_widget)
    with pytest.raises(RegistryError, match="already registered"):
        widgets.register("a")(second_widget)


def test_registering_the_same_object_twice_is_fine():
    # A module imported twice (e.g. under two import paths) re-registers the same object.
    widgets = Registry("widget")
    widgets.register("a", first_widget)
    widgets.register("a")(first_widget)
    assert widgets.get("a") is first_widget and len(widgets) == 1


def test_unknown_name_lists_the_registered_names():
    widgets = Registry("widget")
    widgets.register("beta", second_widget)
    widgets.register("alpha", first_widget)
    with pytest.raises(RegistryError) as info:
        widgets.get("alpah")
    assert str(info.value) == "unknown widget 'alpah'; registered: alpha, beta"


def test_unknown_name_in_an_empty_registry():
    with pytest.raises(RegistryError, match=r"unknown widget 'x'; registered: \(none\)"):
        Registry("widget").get("x")


def test_str_of_the_error_is_the_plain_sentence():
    # KeyError's own str() wraps the message in quotes: str(KeyError("a b")) == "'a b'".
    with pytest.raises(RegistryError) as info:
        Registry("widget").get("x")
    err = info.value
    assert str(err) == err.args[0]
    assert not str(err).startswith(("'", '"'))
    assert isinstance(err, KeyError)  # callers that catch KeyError keep working


@pytest.mark.parametrize("name", ["", None, 3])
def test_name_must_be_a_non_empty_string(name):
    widgets = Registry("widget")
    with pytest.raises(RegistryError, match="widget name must be a non-empty string"):
        widgets.register(name, first_widget)
    assert len(widgets) == 0


def test_an_entry_carries_the_spec_it_was_registered_with():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Spec:
        shares_model: bool = False

    reg = Registry("widget")
    reg.register("b", lambda: None, spec=Spec(shares_model=True))
    reg.register("a")(lambda: None)
    assert reg.spec("b") == Spec(shares_model=True) and reg.spec("a") is None
    assert reg.names() == ["a", "b"] and reg.in_registration_order() == ["b", "a"]
    with pytest.raises(RegistryError, match="unknown widget 'c'"):
        reg.spec("c")
