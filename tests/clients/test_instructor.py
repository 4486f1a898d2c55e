"""instructor's TOOLS (its default) and JSON_SCHEMA modes over the openai SDK."""
import instructor
import pytest
from pydantic import BaseModel


class User(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_extracts_a_typed_object(openai_client, mode):
    from .conftest import CHAT
    client = instructor.from_openai(openai_client, mode=mode)
    user = client.chat.completions.create(
        model=CHAT, response_model=User, max_retries=1, max_tokens=96, temperature=0,
        messages=[{"role": "user", "content": "Extract the user: John is 30 years old."}])
    assert isinstance(user, User) and user.name and isinstance(user.age, int)
