import random, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from kvbench.resources import models_dir
from kvbench.api import press
path = models_dir() / "tiny-niah"
model = AutoModelForCausalLM.from_pretrained(path); tok = AutoTokenizer.from_pretrained(path)
from kvbench.tiny_model import FILLER_WORDS
rng = random.Random(0)
hay = " ".join(" ".join(rng.choices(FILLER_WORDS, k=8)) + " ." for _ in range(60))
context = ("a special magic number is hidden within the following text . make sure to memorize it . i will quiz you about the number afterwards . "
  + hay[: len(hay)//2] + " one of the special magic numbers is bababa 57 83 . " + hay[len(hay)//2:] + "\n")
question = "what is the special magic number for bababa ? the special magic number is bababa"
inputs = tok(context + question, return_tensors="pt")
print(inputs.input_ids.shape, model.config._attn_implementation)
t=time.time()
plain = model.generate(**inputs, max_new_tokens=4, do_sample=False)
print("plain", plain[0, inputs.input_ids.shape[1]:].tolist(), time.time()-t)
with press(model, "full", "full") as rec:
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
print("full", out[0, inputs.input_ids.shape[1]:].tolist(), rec.achieved_per_layer)
with press(model, "snapkv", "64L") as rec:
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
print("snapkv", out[0, inputs.input_ids.shape[1]:].tolist(), rec.requested_per_layer, rec.achieved_per_layer, rec.last.final_per_layer)
n_ctx = len(tok(context).input_ids)
with press(model, "snapkv", "64L", "agnostic", context_length=n_ctx) as rec:
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
print("agn", out[0, inputs.input_ids.shape[1]:].tolist(), rec.requested_per_layer, rec.achieved_per_layer, rec.last.context_tokens, rec.last.final_per_layer)
print(model.config._attn_implementation, model._forward_pre_hooks, model._forward_hooks)
