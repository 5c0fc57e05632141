"""A long document with one fact buried in the middle, and a question about it (for the demo)."""
import random

random.seed(7)
subjects = ["The river", "A merchant", "The old mill", "Her brother", "The council", "A traveller", "The lighthouse keeper"]
verbs = ["watched", "remembered", "carried", "repaired", "described", "followed", "counted"]
objects = ["the grain barges", "the winter storms", "a ledger of debts", "the northern road", "the bells of the chapel", "a crate of lamps", "the tide tables"]
tails = ["before the frost came.", "while the town slept.", "for many quiet years.", "without a word of complaint.", "as the harbour filled.", "long after the fair had ended."]
sentences = [f"{random.choice(subjects)} {random.choice(verbs)} {random.choice(objects)} {random.choice(tails)}" for _ in range(160)]
sentences.insert(80, "The secret code for the harbour gate is 4172.")
print(" ".join(sentences))
print("\nQuestion: What is the secret code for the harbour gate? Answer with the number.")
