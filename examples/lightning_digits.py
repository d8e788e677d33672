"""A Lightning CNN learns handwritten digits through psrt.

scikit-learn's digits (8x8 images, shipped inside the package), a small CNN
with BatchNorm, SGD with momentum under a cosine schedule, gradient
clipping, and bf16 autocast with --bf16. PsrtStrategy shards each epoch
over the job's workers, runs the optimizer on the servers on the mean
gradient, and lets rank 0 alone log and save checkpoints; validation
metrics logged with sync_dist are the workers' mean.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/lightning_digits.py

The psrt-specific line is marked "psrt:".
"""

import argparse

import lightning as L
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from psrt.torch.lightning import PsrtStrategy


class DigitsCNN(L.LightningModule):
    def __init__(self, lr, epochs):
        super().__init__()
        self.lr, self.epochs = lr, epochs
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(128, 10))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.epochs)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="images per step and worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--root", default="lightning_digits", help="where rank 0 logs and checkpoints")
    args = p.parse_args()
    L.seed_everything(0)
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    trainer = L.Trainer(strategy=PsrtStrategy(),  # psrt: the optimizer runs on the servers
                        accelerator="auto", devices=1, max_epochs=args.epochs, gradient_clip_val=1.0,
                        precision="bf16-mixed" if args.bf16 else "32-true", default_root_dir=args.root,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(DigitsCNN(args.lr, args.epochs),
                DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch, shuffle=True),
                DataLoader(TensorDataset(x_val, y_val), batch_size=256))
    if trainer.is_global_zero:
        print("digits: validation accuracy %.3f" % trainer.callback_metrics["val_acc"])


if __name__ == "__main__":
    main()
