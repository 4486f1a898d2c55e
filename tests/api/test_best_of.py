"""Which candidates `best_of` keeps: the highest mean log probability per token, best first,
per prompt (completions.best_of over Choice-like records, no engine)."""
from stackd.api.inference.completions import best_of


class Candidate:
    def __init__(self, name: str, logprobs: list[float]):
        self.name = name
        self.logprobs = [(0, lp, b"x", []) for lp in logprobs]


def names(chosen) -> list[str]:
    return [c.name for c in chosen]


def test_the_best_mean_wins_not_the_best_sum():
    short = Candidate("short", [-1.0])                       # sum -1.0, mean -1.0
    long = Candidate("long", [-0.5, -0.5, -0.5, -0.5])       # sum -2.0, mean -0.5
    assert names(best_of([short, long], 2, 1)) == ["long"]


def test_each_prompt_keeps_its_own_best_in_order():
    generated = [Candidate("a0", [-3.0]), Candidate("a1", [-1.0]), Candidate("a2", [-2.0]),
                 Candidate("b0", [-0.1]), Candidate("b1", [-0.3]), Candidate("b2", [-0.2])]
    assert names(best_of(generated, 3, 2)) == ["a1", "a2", "b0", "b2"]


def test_as_many_candidates_as_choices_keeps_them_all_in_order():
    generated = [Candidate("a", [-5.0]), Candidate("b", [-0.1])]
    assert names(best_of(generated, 2, 2)) == ["a", "b"]


def test_a_candidate_without_tokens_ranks_as_certain_and_ties_keep_their_order():
    empty, tie1, tie2 = Candidate("empty", []), Candidate("t1", [-0.2]), Candidate("t2", [-0.2])
    assert names(best_of([tie1, tie2, empty], 3, 2)) == ["empty", "t1"]
