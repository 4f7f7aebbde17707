import './base.css';
import './chat.css';
import './modelstore.css';
