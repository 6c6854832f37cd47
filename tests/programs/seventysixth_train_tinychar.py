# train a miniature character-level model on the tinychar shards
# good for debugging and playing on macbooks and such
# (the seventy-sixth style's config/train_tinychar.py, linked into each run's folder)

out_dir = "out-tinychar"
eval_interval = 20  # keep frequent because we'll overfit
eval_iters = 4
log_interval = 5  # don't print too too often

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

dataset = "tinychar"
gradient_accumulation_steps = 1
batch_size = 8
block_size = 32  # context of up to 32 previous characters

# baby GPT model :)
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0

learning_rate = 3e-3  # with baby networks can afford to go a bit higher
max_iters = 60
lr_decay_iters = 60  # make equal to max_iters usually
min_lr = 3e-4  # learning_rate / 10 usually
beta2 = 0.99  # make a bit bigger because number of tokens per iter is small

warmup_iters = 10  # not super necessary potentially

# on a CPU box
device = "cpu"
backend = "gloo"
dtype = "float32"
compile_backend = "aot_eager"  # inductor needs minutes of C++ per graph on this box
