"""lm-eval task helpers: a 4-way multiple-choice task built from GSM8K test problems (the gold
final answer and the final answers of the next three problems, in a rotating position)."""


def final_answer(answer: str) -> str:
    return answer.split("####")[-1].strip().replace(",", "")


def process_docs(dataset):
    answers = [final_answer(a) for a in dataset["answer"]]
    n = len(answers)

    def add_choices(doc, i):
        gold = answers[i]
        others = []
        for j in range(1, n):
            a = answers[(i + j) % n]
            if a != gold and a not in others:
                others.append(a)
            if len(others) == 3:
                break
        pos = i % 4
        choices = others[:pos] + [gold] + others[pos:]
        return {"question": doc["question"], "choices": choices, "gold": pos}

    return dataset.map(add_choices, with_indices=True)
