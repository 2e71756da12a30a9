"""Ray backend: one plan spread over the nodes of a Ray cluster, each run placed by Ray's scheduler.

The orchestrator (``pool.RayPool``, driven by ``runner.run_plan``) submits every run of the plan
as a Ray task and saves each result the moment it comes back; nothing but Ray connects the two
sides, so no shared file system is needed. A task asks for 1 CPU, one ``suite_slot`` (a custom
resource: a node offering one runs one benchmark at a time, so a neighbour never skews a timing),
its point's GPUs (``num_gpus``) and, when the scenario's ``gpu_model`` or ``--gpu-model`` names a
model, a share of the custom resource ``gpu_model:NAME`` that only nodes of that model offer.

On its node the task (``run_point``) runs the point through the run skeleton of the node's own
Docker engine (its DOCKER_HOST, or the local socket) when one answers, else of the local backend.
Ray sets the task's CUDA_VISIBLE_DEVICES to the GPUs it assigned; both backends read that variable
as CUDA does (``gpu_pool.inherit_pool``) and hand the run exactly those GPUs, by UUID. A node builds
the image a run needs before its first run when it lacks it (the recipe-hash rule of ``images``).
The checkout travels with the job (Ray's ``working_dir``: the suite, its image catalog, Dockerfile
and locks): every result records the identity of the checkout the orchestrator shipped.

Faults: Ray's own retries are off (``max_retries=0``): a run is never repeated behind the plan's
back. A node that dies mid-run has that run recorded (``error``, "node lost") and retried once on
another node of the same GPU model (``run.ray.retry_of``); a crashed worker's node is watched for
Ray's verdict over later polls, never inside one. A task still running well past its deadline is
stopped by the orchestrator and recorded as ``timeout`` (the node's own deadline normally fires
first). Ctrl-C or SIGTERM stops every started task (each kills and removes its container), forces
what has not ended after a grace, and leaves the queued ones to end with the job. A cluster whose
head stops answering ends the plan with a message; results already saved stay, and so does one
that had reached the orchestrator. Every result taken from Ray stays with the pool until the runner
says it is saved, so an interrupt at any point loses none.

What a task's run starts (a container, a local worker's process group) does not die with the task's
Ray worker: a task killed by force (after a stop's grace, at its deadline, by Ray's memory monitor,
or a crash) leaves it running until the worker's own deadline. Its backend tags everything it
starts with the plan and the attempt (``base.tag_labels``, ``tag_env``), and the orchestrator sends
``sweep``, pinned to the node, to remove it. A backend closed while its worker is still starting
stops that worker itself the moment it exists (``RunSkeleton.closed``).

Stopping is asked through the board, not with ``ray.cancel``: each task looks at the board while
its run goes on and stops its own run. ``ray.cancel`` of a task whose reply is on its way can crash
the driver inside Ray (a check in its task manager, "Tried to complete task that was not pending",
ray-project/ray#54798 fixes one such race); Ray retries a polite cancel every few seconds while the
task tidies up, so the race was met. ``ray.cancel(force=True)`` is left for a task that did not
answer the board within the grace, and for a queued task no node can place.

The modules, from the node up: ``placement`` (what a run asks of the cluster), ``threads`` (bounded
calls), ``board`` (the plan's board actor and a task's calls to it), ``leftovers`` (what a forced
task left), ``task`` (the Ray task on the node), ``attempts`` (the orchestrator's records), ``head`` (the
pool's link to the cluster), ``stopping`` (Ctrl-C and forced stops) and ``pool`` (``RayPool``).
"""

from suite.backends.ray_cluster.head import import_ray, shipped_code
from suite.backends.ray_cluster.placement import SLOT, demand, placement_problem
from suite.backends.ray_cluster.pool import Finished, RayPool

__all__ = ["SLOT", "Finished", "RayPool", "demand", "import_ray", "placement_problem", "shipped_code"]
