"""Model names with a registry host: which registry a name may make the daemon fetch from."""
import pytest

from stackd.errors import Code, DomainError
from stackd.store.oci import parse_reference
from stackd.store.pulling import RegistrySettings, model_id_for
from stackd.store.store import valid_model_id

SETTINGS = RegistrySettings(url="http://127.0.0.1:5000", others=("https://registry.ollama.ai", "https://hf.co",
                                                                  "http://10.0.0.5:8080"))


@pytest.mark.parametrize("host,url", [("", "http://127.0.0.1:5000"), ("127.0.0.1:5000", "http://127.0.0.1:5000"),
                                      ("registry.ollama.ai", "https://registry.ollama.ai"),
                                      ("hf.co", "https://hf.co"), ("10.0.0.5:8080", "http://10.0.0.5:8080")])
def test_listed_hosts_and_the_configured_registry(host, url):
    assert SETTINGS.base_url(host) == url


@pytest.mark.parametrize("host", ["registry.ollama.ai:443x", "registry.ollama.ai:8443", "10.0.0.5",
                                  "127.0.0.1:5001", "evil.example", "hf.co.evil.example", "localhost"])
def test_any_other_host_is_forbidden(host):
    with pytest.raises(DomainError) as caught:
        SETTINGS.base_url(host)
    assert caught.value.code is Code.FORBIDDEN and "models.registries" in caught.value.message


def test_a_default_port_written_out_is_the_same_registry():
    assert RegistrySettings(others=("https://r.example:443",)).base_url("r.example") == "https://r.example:443"
    assert RegistrySettings(others=("http://r.example",)).base_url("r.example") == "http://r.example"


def test_without_a_configured_registry_a_plain_name_says_so():
    with pytest.raises(DomainError, match="no model registry is configured"):
        RegistrySettings().base_url("")


@pytest.mark.parametrize("name,model_id", [("hf.co/u/Repo-GGUF:Q4_K_M", "hf.co/u/repo-gguf:Q4_K_M"),
                                           ("localhost:5000/x", "localhost:5000/library/x:latest"),
                                           ("x", "x:latest"), ("ns/x:1", "ns/x:1")])
def test_the_store_ids_of_pulled_names(name, model_id):
    assert model_id_for(parse_reference(name)) == model_id and valid_model_id(model_id)


def test_a_name_whose_store_id_would_be_too_long_is_refused_before_any_fetch(tmp_path):
    import asyncio

    from stackd.store.pulling import PullService
    from stackd.store.store import ModelStore

    service = PullService(ModelStore(str(tmp_path)), SETTINGS)
    name = "10.0.0.5:8080/" + "n" * 64 + ":" + "t" * 120           # 199 characters, id 207
    assert len(name) <= 200

    async def first():
        return await anext(service.pull(name))
    with pytest.raises(DomainError, match="longer than 200") as caught:
        asyncio.run(first())
    assert caught.value.code is Code.INVALID
