# examples/python_api.py: GRPO from Python, as with TRL (offline: a tiny twin and four generated images)
from datasets import Dataset
from PIL import Image

from vlm_grpo import GRPOConfig, GRPOTrainer

colours = ["red", "green", "blue", "yellow"]
dataset = Dataset.from_list([
    {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is this?"}]}],
     "image": Image.new("RGB", (56, 56), colour), "solution": colour}
    for colour in colours
])


def accuracy(completions, solution, **kwargs):
    return [float(answer in completion[0]["content"].lower()) for completion, answer in zip(completions, solution)]


args = GRPOConfig(output_dir="runs/colours", max_steps=2, batch_size=2, num_generations=4,
                  max_completion_length=16, learning_rate=1e-5, beta=0.04)
trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[accuracy, "trl.rewards:think_format_reward"],
                      args=args, train_dataset=dataset)
trainer.train()
trainer.save_model()  # runs/colours/final: weights, processor, model card
