# A VLM GRPO script shaped like TRL's examples/scripts/grpo_vlm.py. The one line that differs from a TRL script is
# marked; MODEL and OUTPUT_DIR come from the test (a hub id and a folder in a real script).
import torch
from datasets import Dataset
from peft import LoraConfig
from PIL import Image
from trl.rewards import accuracy_reward, think_format_reward

from vlm_grpo import GRPOConfig, GRPOTrainer  # the only change: TRL's script has `from trl import ...`

SYSTEM_PROMPT = (
    "A conversation between user and assistant. The user asks a question, and the assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process is enclosed within <think> </think> tags, i.e., <think>\nThis is my reasoning.\n</think>\nThis is my "
    "answer."
)


def make_conversation(example):
    prompt = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": example["problem"]}]},
    ]
    return {"prompt": prompt}


rows = [{"image": Image.new("RGB", (56, 56), (40 * n, 200 - 30 * n, 90)), "problem": f"How many shapes? ({n})",
         "solution": str(n)} for n in range(1, 7)]
dataset = Dataset.from_list(rows).map(make_conversation)
split = dataset.train_test_split(test_size=2, seed=0)
train_dataset, eval_dataset = split["train"], split["test"]

training_args = GRPOConfig(
    output_dir=OUTPUT_DIR,  # noqa: F821 (given by the test)
    learning_rate=1e-5,
    per_device_train_batch_size=4,
    num_generations=2,
    max_completion_length=8,
    max_steps=2,
    logging_steps=1,
    save_strategy="steps",
    save_steps=1,
    eval_strategy="steps",
    eval_steps=2,
    report_to="none",
    model_init_kwargs={"dtype": torch.float32, "attn_implementation": "eager"},
    bf16=False,
    gradient_checkpointing=False,
    remove_unused_columns=False,
)
trainer = GRPOTrainer(
    model=MODEL,  # noqa: F821 (given by the test)
    args=training_args,
    reward_funcs=[think_format_reward, accuracy_reward],
    train_dataset=train_dataset,
    eval_dataset=eval_dataset,
    peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
)
trainer.train()
trainer.save_model(training_args.output_dir)
